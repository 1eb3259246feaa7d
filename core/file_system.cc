#include "core/file_system.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path,
                        int err) {
  const std::string msg =
      absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == ENOSPC || err == EFBIG || err == EDQUOT) {
    return absl::ResourceExhaustedError(msg);
  }
  return absl::InternalError(msg);
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path)
      : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    if (fd_ < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("write to closed file ", path_));
    }
    const char* p = data.data();
    size_t n = data.size();
    while (n > 0) {
      const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
      const ssize_t w = ::write(fd_, p, chunk);
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(absl::StrCat("cannot write ", n, " bytes at offset ",
                                       offset_, " of"),
                          path_, errno);
      }
      p += w;
      n -= w;
      offset_ += w;
    }
    return absl::OkStatus();
  }

  absl::Status SyncAndClose() override {
    if (fd_ < 0) return absl::OkStatus();
    const int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError("cannot fsync", path_, err);
    }
    if (::close(fd) != 0) return ErrnoError("cannot close", path_, errno);
    return absl::OkStatus();
  }

  const std::string& path() const override { return path_; }

 private:
  int fd_;
  std::string path_;
  uint64_t offset_ = 0;
};

class PosixFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    const int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError("cannot create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path));
  }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("cannot open", path, errno);
    std::string out;
    char buf[1 << 16];
    while (true) {
      const ssize_t r = ::read(fd, buf, sizeof(buf));
      if (r < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        return ErrnoError("cannot read", path, err);
      }
      if (r == 0) break;
      out.append(buf, r);
    }
    ::close(fd);
    return out;
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoError(absl::StrCat("cannot rename ", from, " to"), to, errno);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const std::string d = dir.empty() ? "." : dir;
    const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("cannot open directory", d, errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoError("cannot fsync directory", d, err);
    return absl::OkStatus();
  }

  absl::Status CreateDirs(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot create directory ", dir, ": ", ec.message()));
    }
    return absl::OkStatus();
  }

  absl::Status RemoveAll(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot remove ", path, ": ", ec.message()));
    }
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoError("cannot remove", path, errno);
    }
    return absl::OkStatus();
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }
};

std::atomic<FileSystem*> g_file_system{nullptr};

}  // namespace

FileSystem* FileSystem::Posix() {
  static FileSystem* fs = new PosixFileSystem;
  return fs;
}

FileSystem* GetFileSystem() {
  FileSystem* fs = g_file_system.load(std::memory_order_acquire);
  return fs != nullptr ? fs : FileSystem::Posix();
}

FileSystem* SetFileSystemForTesting(FileSystem* fs) {
  FileSystem* previous = g_file_system.exchange(fs);
  return previous != nullptr ? previous : FileSystem::Posix();
}

}  // namespace mcc
