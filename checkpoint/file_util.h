#ifndef CHECKPOINT_FILE_UTIL_H_
#define CHECKPOINT_FILE_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/file_system.h"

namespace mcc {
namespace file_util {

// File helpers whose errors name the path and errno's text. They go through
// GetFileSystem() (core/file_system.h), so tests can inject write failures.

// A file open for writing (created or truncated); Close() fsyncs.
class WritableFile {
 public:
  static absl::StatusOr<WritableFile> Create(const std::string& path);
  WritableFile(WritableFile&& other) noexcept;
  WritableFile& operator=(WritableFile&& other) = delete;
  WritableFile(const WritableFile&) = delete;
  ~WritableFile();  // Closes without syncing if Close() was not called.

  absl::Status Append(const void* data, size_t n);
  absl::Status PadTo(uint64_t alignment);  // Zero bytes up to a multiple.
  // fsync, then close.
  absl::Status Close();
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  WritableFile(std::unique_ptr<mcc::WritableFile> file, std::string path)
      : file_(std::move(file)), path_(std::move(path)) {}
  std::unique_ptr<mcc::WritableFile> file_;
  std::string path_;
  uint64_t size_ = 0;
};

// Writes contents to path + ".tmp", fsyncs, renames over path, fsyncs the
// directory: readers see the old or the new file, never a partial one.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
absl::Status FsyncDir(const std::string& dir);
absl::Status MakeDirs(const std::string& dir);
absl::Status RemoveAll(const std::string& path);
absl::Status Rename(const std::string& from, const std::string& to);
bool Exists(const std::string& path);
std::string JoinPath(absl::string_view a, absl::string_view b);

}  // namespace file_util
}  // namespace mcc

#endif  // CHECKPOINT_FILE_UTIL_H_
