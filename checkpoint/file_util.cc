#include "checkpoint/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace file_util {
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

}  // namespace

absl::StatusOr<WritableFile> WritableFile::Create(const std::string& path) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", path, errno);
  return WritableFile(fd, path);
}

WritableFile::WritableFile(WritableFile&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), size_(other.size_) {
  other.fd_ = -1;
}

WritableFile::~WritableFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status WritableFile::Append(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    const ssize_t w = ::write(fd_, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(
          absl::StrCat("cannot write ", n, " bytes at offset ", size_, " of"),
          path_, errno);
    }
    p += w;
    n -= w;
    size_ += w;
  }
  return absl::OkStatus();
}

absl::Status WritableFile::PadTo(uint64_t alignment) {
  static const char kZeros[4096] = {};
  const uint64_t pad = (alignment - size_ % alignment) % alignment;
  if (pad == 0) return absl::OkStatus();
  return Append(kZeros, pad);
}

absl::Status WritableFile::Close() {
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

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  const std::string tmp = path + ".tmp";
  {
    auto file = WritableFile::Create(tmp);
    if (!file.ok()) return file.status();
    absl::Status s = file->Append(contents.data(), contents.size());
    if (s.ok()) s = file->Close();
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
  }
  if (absl::Status s = Rename(tmp, path); !s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncDir(std::filesystem::path(path).parent_path().string());
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
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

absl::Status FsyncDir(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open directory", d, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync directory", d, err);
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create directory ", dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot remove ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status Rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoError(absl::StrCat("cannot rename ", from, " to"), to, errno);
  }
  return absl::OkStatus();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  if (a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

}  // namespace file_util
}  // namespace mcc
