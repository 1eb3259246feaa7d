#include "core/testing/fault_injecting_file_system.h"

#include "absl/strings/str_cat.h"

namespace mcc {
namespace testing {
namespace {

absl::Status Injected(FileOp op, const std::string& path, Fault fault) {
  const std::string what =
      absl::StrCat(FileOpName(op), " ", path, ": ",
                   fault == Fault::kIoError ? "Input/output error"
                                            : "No space left on device",
                   " (injected)");
  return fault == Fault::kIoError ? absl::InternalError(what)
                                  : absl::ResourceExhaustedError(what);
}

class FaultyFile : public WritableFile {
 public:
  FaultyFile(std::unique_ptr<WritableFile> base, FaultInjectingFileSystem* fs)
      : base_(std::move(base)), fs_(fs) {}

  absl::Status Append(absl::string_view data) override {
    Fault fault;
    absl::Status s = fs_->Next(FileOp::kAppend, base_->path(), &fault);
    if (!s.ok()) {
      if (fault == Fault::kShortWrite) {
        base_->Append(data.substr(0, data.size() / 2)).IgnoreError();
        return absl::ResourceExhaustedError(absl::StrCat(
            "short write to ", base_->path(), ": wrote ", data.size() / 2,
            " of ", data.size(), " bytes (injected)"));
      }
      return s;
    }
    return base_->Append(data);
  }

  absl::Status SyncAndClose() override {
    Fault fault;
    absl::Status s = fs_->Next(FileOp::kSyncClose, base_->path(), &fault);
    absl::Status closed = base_->SyncAndClose();
    return s.ok() ? closed : s;
  }

  const std::string& path() const override { return base_->path(); }

 private:
  std::unique_ptr<WritableFile> base_;
  FaultInjectingFileSystem* fs_;
};

}  // namespace

const char* FileOpName(FileOp op) {
  switch (op) {
    case FileOp::kCreate:
      return "create";
    case FileOp::kAppend:
      return "write";
    case FileOp::kSyncClose:
      return "fsync";
    case FileOp::kRename:
      return "rename";
    case FileOp::kSyncDir:
      return "fsync directory";
    case FileOp::kCreateDirs:
      return "create directory";
    case FileOp::kRemove:
      return "remove";
  }
  return "?";
}

const char* FaultName(Fault fault) {
  switch (fault) {
    case Fault::kNoSpace:
      return "ENOSPC";
    case Fault::kIoError:
      return "EIO";
    case Fault::kShortWrite:
      return "short write";
  }
  return "?";
}

FaultInjectingFileSystem::FaultInjectingFileSystem(FileSystem* base)
    : base_(base) {}

void FaultInjectingFileSystem::FailOperation(int64_t index, Fault fault) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_index_ = index;
  fault_ = fault;
  fired_ = false;
  ops_.clear();
}

std::vector<FileOpRecord> FaultInjectingFileSystem::operations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_;
}

bool FaultInjectingFileSystem::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

absl::Status FaultInjectingFileSystem::Next(FileOp op, const std::string& path,
                                            Fault* fault) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t index = static_cast<int64_t>(ops_.size());
  ops_.push_back({op, path});
  *fault = fault_;
  if (index != fail_index_) return absl::OkStatus();
  fired_ = true;
  return Injected(op, path, fault_);
}

absl::StatusOr<std::unique_ptr<WritableFile>>
FaultInjectingFileSystem::NewWritableFile(const std::string& path) {
  Fault fault;
  absl::Status s = Next(FileOp::kCreate, path, &fault);
  if (!s.ok()) return s;
  absl::StatusOr<std::unique_ptr<WritableFile>> file =
      base_->NewWritableFile(path);
  if (!file.ok()) return file.status();
  return std::unique_ptr<WritableFile>(new FaultyFile(std::move(*file), this));
}

absl::StatusOr<std::string> FaultInjectingFileSystem::ReadFile(
    const std::string& path) {
  return base_->ReadFile(path);
}

absl::Status FaultInjectingFileSystem::Rename(const std::string& from,
                                              const std::string& to) {
  Fault fault;
  absl::Status s = Next(FileOp::kRename, from + " -> " + to, &fault);
  return s.ok() ? base_->Rename(from, to) : s;
}

absl::Status FaultInjectingFileSystem::SyncDir(const std::string& dir) {
  Fault fault;
  absl::Status s = Next(FileOp::kSyncDir, dir, &fault);
  return s.ok() ? base_->SyncDir(dir) : s;
}

absl::Status FaultInjectingFileSystem::CreateDirs(const std::string& dir) {
  Fault fault;
  absl::Status s = Next(FileOp::kCreateDirs, dir, &fault);
  return s.ok() ? base_->CreateDirs(dir) : s;
}

absl::Status FaultInjectingFileSystem::RemoveAll(const std::string& path) {
  Fault fault;
  absl::Status s = Next(FileOp::kRemove, path, &fault);
  return s.ok() ? base_->RemoveAll(path) : s;
}

absl::Status FaultInjectingFileSystem::RemoveFile(const std::string& path) {
  Fault fault;
  absl::Status s = Next(FileOp::kRemove, path, &fault);
  return s.ok() ? base_->RemoveFile(path) : s;
}

bool FaultInjectingFileSystem::Exists(const std::string& path) {
  return base_->Exists(path);
}

}  // namespace testing
}  // namespace mcc
