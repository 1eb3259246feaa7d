#include "checkpoint/file_util.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/file_system.h"

namespace mcc {
namespace file_util {

absl::StatusOr<WritableFile> WritableFile::Create(const std::string& path) {
  absl::StatusOr<std::unique_ptr<mcc::WritableFile>> file =
      GetFileSystem()->NewWritableFile(path);
  if (!file.ok()) return file.status();
  return WritableFile(std::move(*file), path);
}

WritableFile::WritableFile(WritableFile&& other) noexcept
    : file_(std::move(other.file_)),
      path_(std::move(other.path_)),
      size_(other.size_) {}

WritableFile::~WritableFile() = default;

absl::Status WritableFile::Append(const void* data, size_t n) {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("write to closed file ", path_));
  }
  absl::Status s =
      file_->Append(absl::string_view(static_cast<const char*>(data), n));
  if (s.ok()) size_ += n;
  return s;
}

absl::Status WritableFile::PadTo(uint64_t alignment) {
  static const char kZeros[4096] = {};
  const uint64_t pad = (alignment - size_ % alignment) % alignment;
  if (pad == 0) return absl::OkStatus();
  return Append(kZeros, pad);
}

absl::Status WritableFile::Close() {
  if (file_ == nullptr) return absl::OkStatus();
  std::unique_ptr<mcc::WritableFile> file = std::move(file_);
  return file->SyncAndClose();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  FileSystem* fs = GetFileSystem();
  const std::string tmp = path + ".tmp";
  {
    auto file = WritableFile::Create(tmp);
    if (!file.ok()) return file.status();
    absl::Status s = file->Append(contents.data(), contents.size());
    if (s.ok()) s = file->Close();
    if (!s.ok()) {
      fs->RemoveFile(tmp).IgnoreError();
      return s;
    }
  }
  if (absl::Status s = Rename(tmp, path); !s.ok()) {
    fs->RemoveFile(tmp).IgnoreError();
    return s;
  }
  return FsyncDir(std::filesystem::path(path).parent_path().string());
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  return GetFileSystem()->ReadFile(path);
}

absl::Status FsyncDir(const std::string& dir) {
  return GetFileSystem()->SyncDir(dir);
}

absl::Status MakeDirs(const std::string& dir) {
  return GetFileSystem()->CreateDirs(dir);
}

absl::Status RemoveAll(const std::string& path) {
  return GetFileSystem()->RemoveAll(path);
}

absl::Status Rename(const std::string& from, const std::string& to) {
  return GetFileSystem()->Rename(from, to);
}

bool Exists(const std::string& path) { return GetFileSystem()->Exists(path); }

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  if (a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

}  // namespace file_util
}  // namespace mcc
