#ifndef CORE_FILE_SYSTEM_H_
#define CORE_FILE_SYSTEM_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {

// The file operations that writers of checkpoints and datasets use, behind
// one interface (as LevelDB's Env) so a test can replace it and inject
// ENOSPC, EIO, short writes and failing fsyncs or renames at each step.
//
// Errors name the operation and the path, with errno's text; a full disk is
// ResourceExhausted, a missing file NotFound.
// Thread-safety: implementations are safe to call from any thread; one
// WritableFile is used by one thread at a time.
class WritableFile {
 public:
  virtual ~WritableFile() = default;  // Closes without syncing.
  // Appends all of data, or fails naming the file and the offset.
  virtual absl::Status Append(absl::string_view data) = 0;
  // fsync, then close. The file is unusable afterwards, whatever the result.
  virtual absl::Status SyncAndClose() = 0;
  virtual const std::string& path() const = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates (or truncates) path for writing.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
  virtual absl::Status RemoveAll(const std::string& path) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;

  // The POSIX file system.
  static FileSystem* Posix();
};

// The file system every writer uses: Posix() unless a test set another.
FileSystem* GetFileSystem();
// Installs fs (null: Posix()) and returns the previous one. For tests; not
// to be called while files are being written.
FileSystem* SetFileSystemForTesting(FileSystem* fs);

}  // namespace mcc

#endif  // CORE_FILE_SYSTEM_H_
