#ifndef CORE_TESTING_FAULT_INJECTING_FILE_SYSTEM_H_
#define CORE_TESTING_FAULT_INJECTING_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/file_system.h"

namespace mcc {
namespace testing {

// The mutating operations a writer performs, in order.
enum class FileOp {
  kCreate,
  kAppend,
  kSyncClose,
  kRename,
  kSyncDir,
  kCreateDirs,
  kRemove
};
const char* FileOpName(FileOp op);

enum class Fault {
  kNoSpace,     // ENOSPC: nothing written.
  kIoError,     // EIO.
  kShortWrite,  // Append writes half its bytes, then fails (ENOSPC).
};
const char* FaultName(Fault fault);

struct FileOpRecord {
  FileOp op;
  std::string path;
};

// A file system (core/file_system.h) over another that fails one chosen
// operation, as LevelDB's fault-injection Env does: the index-th mutating
// operation (counting from 0 across all files) fails with the fault, every
// other goes through. Reads never fail. Records every mutating operation so
// a test can first count a save's steps, then fail each in turn.
// Thread-safe.
class FaultInjectingFileSystem : public FileSystem {
 public:
  explicit FaultInjectingFileSystem(FileSystem* base = FileSystem::Posix());

  // Fails operation `index` (-1: none) with `fault`.
  void FailOperation(int64_t index, Fault fault);
  std::vector<FileOpRecord> operations() const;
  // Whether the chosen operation has come (and failed).
  bool fired() const;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override;
  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status CreateDirs(const std::string& dir) override;
  absl::Status RemoveAll(const std::string& path) override;
  absl::Status RemoveFile(const std::string& path) override;
  bool Exists(const std::string& path) override;

  // Records op and returns the injected error if it is the chosen one.
  absl::Status Next(FileOp op, const std::string& path, Fault* fault);

 private:
  FileSystem* base_;
  mutable std::mutex mu_;
  int64_t fail_index_ = -1;
  Fault fault_ = Fault::kIoError;
  bool fired_ = false;
  std::vector<FileOpRecord> ops_;
};

// Installs a file system for the scope of a test.
class ScopedFileSystem {
 public:
  explicit ScopedFileSystem(FileSystem* fs)
      : previous_(SetFileSystemForTesting(fs)) {}
  ~ScopedFileSystem() { SetFileSystemForTesting(previous_); }

 private:
  FileSystem* previous_;
};

}  // namespace testing
}  // namespace mcc

#endif  // CORE_TESTING_FAULT_INJECTING_FILE_SYSTEM_H_
