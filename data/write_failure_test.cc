// Write failures in the data writers lose nothing: every mutating file
// operation of a dataset build (IndexedDatasetBuilder, what preprocess_data
// writes) and of a cached index file (WriteFileAtomically, the .npy caches)
// is failed in turn with ENOSPC, EIO and a short write. Each failure is an
// error naming the prefix or file, and the final names then hold the old
// content untouched, nothing, or the complete new content: never a
// half-written file, never a .bin that the .idx beside it does not describe.
#include <dirent.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/testing/fault_injecting_file_system.h"
#include "data/indexed_dataset.h"
#include "data/npy.h"
#include "data/test_util.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

using mcc::testing::Fault;
using mcc::testing::FaultInjectingFileSystem;
using mcc::testing::FaultName;
using mcc::testing::FileOpName;
using mcc::testing::ScopedFileSystem;

const Fault kFaults[] = {Fault::kNoSpace, Fault::kIoError, Fault::kShortWrite};

// Documents of the old and the new dataset; the new one spans more than the
// builder's 1 MiB buffer, so the .bin is appended to more than once.
std::vector<std::vector<int32_t>> OldDocuments() { return {{1, 2, 3}, {4}}; }
std::vector<std::vector<int32_t>> NewDocuments() {
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 3; ++d) {
    std::vector<int32_t> doc(250000);
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = (d * 7 + i) % 50000;
    docs.push_back(doc);
  }
  return docs;
}

absl::Status Build(const std::string& prefix,
                   const std::vector<std::vector<int32_t>>& docs) {
  auto b = IndexedDatasetBuilder::Create(prefix, TokenDType::kUInt16);
  if (!b.ok()) return b.status();
  for (const auto& doc : docs) {
    absl::Status s = (*b)->AddDocument(doc);
    if (!s.ok()) return s;
  }
  return (*b)->Finalize();
}

// The documents the dataset at prefix holds, or the error opening it.
absl::StatusOr<std::vector<std::vector<int32_t>>> Contents(
    const std::string& prefix) {
  auto ds = IndexedDataset::Open(prefix);
  if (!ds.ok()) return ds.status();
  std::vector<std::vector<int32_t>> docs;
  for (int64_t i = 0; i < (*ds)->num_sequences(); ++i) {
    const std::vector<int64_t> seq = (*ds)->Get(i);
    docs.emplace_back(seq.begin(), seq.end());
  }
  return docs;
}

// Names in dir that a writer left under a temporary name.
std::vector<std::string> TemporaryFiles(const std::string& dir) {
  std::vector<std::string> left;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return left;
  while (dirent* e = readdir(d)) {
    if (absl::StrContains(e->d_name, ".tmp.")) left.push_back(e->d_name);
  }
  closedir(d);
  return left;
}

TEST(DatasetWriteFailure, EveryStepOfABuildLosesNothing) {
  const std::string dir = testing::TempDir("dataset_write_failure");
  const std::string prefix = dir + "/corpus";
  // Count the build's mutating operations over an existing dataset.
  ASSERT_TRUE(Build(prefix, OldDocuments()).ok());
  FaultInjectingFileSystem counter;
  {
    ScopedFileSystem scope(&counter);
    ASSERT_TRUE(Build(prefix, NewDocuments()).ok());
  }
  const int64_t steps = counter.operations().size();
  ASSERT_GE(steps, 7) << "create, 2 appends, sync, idx create/append/sync, "
                         "remove, 2 renames, sync dir";
  int old_kept = 0, none = 0, new_whole = 0;
  for (int64_t step = 0; step < steps; ++step) {
    for (Fault fault : kFaults) {
      const std::string where = absl::StrCat(
          FileOpName(counter.operations()[step].op), " (step ", step, ") ",
          counter.operations()[step].path, " failing with ", FaultName(fault));
      ASSERT_TRUE(Build(prefix, OldDocuments()).ok()) << where;
      FaultInjectingFileSystem fs;
      fs.FailOperation(step, fault);
      absl::Status status;
      {
        ScopedFileSystem scope(&fs);
        status = Build(prefix, NewDocuments());
      }
      ASSERT_TRUE(fs.fired()) << where;
      ASSERT_FALSE(status.ok()) << where;
      EXPECT_TRUE(absl::StrContains(status.message(), prefix))
          << where << ": " << status;
      EXPECT_TRUE(TemporaryFiles(dir).empty()) << where;
      auto contents = Contents(prefix);
      if (!contents.ok()) {
        // No .idx at the prefix: refused, naming it.
        EXPECT_TRUE(absl::StrContains(contents.status().message(), ".idx"))
            << where << ": " << contents.status();
        ++none;
      } else if (*contents == OldDocuments()) {
        ++old_kept;
      } else {
        EXPECT_EQ(*contents, NewDocuments()) << where;
        ++new_whole;  // Only a failed directory sync comes after the renames.
      }
    }
  }
  std::printf(
      "%lld steps x 3 faults: old dataset kept %d, no index %d, "
      "new dataset complete %d\n",
      static_cast<long long>(steps), old_kept, none, new_whole);
  EXPECT_GT(old_kept, 0);
}

TEST(DatasetWriteFailure, CachedIndexFilesAreWholeOrAbsent) {
  const std::string dir = testing::TempDir("npy_write_failure");
  const std::string path = dir + "/doc_idx.npy";
  const std::vector<int64_t> values = {5, 6, 7, 8};
  FaultInjectingFileSystem counter;
  {
    ScopedFileSystem scope(&counter);
    ASSERT_TRUE(SaveNpy(path, values, {4}).ok());
  }
  const std::string whole = testing::ReadAll(path);
  const int64_t steps = counter.operations().size();
  ASSERT_GE(steps, 4);
  for (int64_t step = 0; step < steps; ++step) {
    for (Fault fault : kFaults) {
      std::remove(path.c_str());
      FaultInjectingFileSystem fs;
      fs.FailOperation(step, fault);
      absl::Status status;
      {
        ScopedFileSystem scope(&fs);
        status = SaveNpy(path, values, {4});
      }
      ASSERT_TRUE(fs.fired());
      ASSERT_FALSE(status.ok()) << "step " << step;
      EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
      EXPECT_TRUE(TemporaryFiles(dir).empty()) << "step " << step;
      const std::string now = testing::ReadAll(path);
      EXPECT_TRUE(now.empty() || now == whole)
          << "step " << step << ": " << now.size() << " bytes";
    }
  }
}

}  // namespace
}  // namespace mcc::data
