// Write failures lose nothing: every mutating file operation of a save
// (sync and async) is failed in turn with ENOSPC, EIO or a short write; the
// save returns an error naming the file, and the previous checkpoint and
// `latest` stay intact and loadable. Then a retry succeeds.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/async_saver.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/test_util.h"
#include "core/testing/fault_injecting_file_system.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using testing::FaultInjectingFileSystem;
using testing::FileOp;
using testing::FileOpRecord;
using testing::ScopedFileSystem;
using testing_util::FreshDir;
using testing_util::RandomTensor;

std::vector<ShardedTensorRef> Model(uint32_t seed) {
  return {ShardedTensorRef::Replicated(
              "a", RandomTensor({64, 32}, DType::kFloat32, seed)),
          ShardedTensorRef::Replicated(
              "b", RandomTensor({128}, DType::kBFloat16, seed + 1))};
}

absl::Status SaveSync(const std::string& dir, int64_t it,
                      const std::vector<ShardedTensorRef>& refs) {
  return SaveCheckpoint(dir, it, refs, {}, {}, DistContext::Single(), {});
}

absl::Status SaveAsync(const std::string& dir, int64_t it,
                       const std::vector<ShardedTensorRef>& refs) {
  AsyncCheckpointSaver saver;
  absl::Status started =
      saver.Start(dir, it, refs, {}, {}, DistContext::Single(), {});
  absl::Status done = saver.Wait();
  return started.ok() ? done : started;
}

// Iteration `it` of dir holds refs' values.
void ExpectHolds(const std::string& dir, int64_t it,
                 const std::vector<ShardedTensorRef>& refs) {
  auto reader = CheckpointReader::Open(dir, it);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const auto& ref : refs) {
    auto t = (*reader)->ReadTensor(ref.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->ToDoubles(), ref.local.ToDoubles()) << ref.name;
  }
}

std::vector<testing::Fault> FaultsFor(FileOp op) {
  if (op == FileOp::kAppend) {
    return {testing::Fault::kNoSpace, testing::Fault::kIoError,
            testing::Fault::kShortWrite};
  }
  if (op == FileOp::kCreate || op == FileOp::kCreateDirs) {
    return {testing::Fault::kNoSpace, testing::Fault::kIoError};
  }
  return {testing::Fault::kIoError};
}

void RunEveryFailure(
    const std::string& name,
    absl::Status (*save)(const std::string&, int64_t,
                         const std::vector<ShardedTensorRef>&)) {
  const auto model1 = Model(100), model2 = Model(200);
  FaultInjectingFileSystem fs;
  // Count the save's operations once, unharmed.
  std::vector<FileOpRecord> ops;
  const std::string count_dir = FreshDir(name + "_count");
  {
    const std::string& dir = count_dir;
    ASSERT_TRUE(SaveSync(dir, 1, model1).ok());
    ScopedFileSystem scoped(&fs);
    fs.FailOperation(-1, testing::Fault::kIoError);
    ASSERT_TRUE(save(dir, 2, model2).ok());
    ops = fs.operations();
  }
  ASSERT_GT(ops.size(), 5u);
  int tried = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    for (testing::Fault fault : FaultsFor(ops[k].op)) {
      SCOPED_TRACE(absl::StrCat(
          name, ": operation ", k, " (", testing::FileOpName(ops[k].op), " ",
          ops[k].path, ") fails with ", testing::FaultName(fault)));
      const std::string dir = FreshDir(absl::StrCat(name, "_", k));
      ASSERT_TRUE(SaveSync(dir, 1, model1).ok());
      absl::Status status;
      {
        ScopedFileSystem scoped(&fs);
        fs.FailOperation(static_cast<int64_t>(k), fault);
        status = save(dir, 2, model2);
        ASSERT_TRUE(fs.fired());
      }
      ++tried;
      if (status.ok()) {
        // Only best-effort clean-up may fail without failing the save.
        EXPECT_EQ(ops[k].op, FileOp::kRemove) << "an injected failure was "
                                                 "lost";
      } else {
        // The error names the file (the first path of the operation, in
        // this trial's directory).
        const std::string path = absl::StrReplaceAll(
            ops[k].path.substr(0, ops[k].path.find(' ')), {{count_dir, dir}});
        EXPECT_TRUE(absl::StrContains(status.message(), path))
            << status.message() << "\ndoes not name " << path;
      }
      // Whatever `latest` names loads, and the previous checkpoint too.
      absl::StatusOr<int64_t> latest = LatestIteration(dir);
      ASSERT_TRUE(latest.ok()) << latest.status();
      ASSERT_TRUE(*latest == 1 || *latest == 2) << *latest;
      ExpectHolds(dir, *latest, *latest == 1 ? model1 : model2);
      if (*latest == 2 && !status.ok()) {
        // Failed after the commit: the new checkpoint is whole.
        EXPECT_TRUE(ops[k].op == FileOp::kSyncDir ||
                    ops[k].op == FileOp::kRemove)
            << status;
      }
      ExpectHolds(dir, 1, model1);
      // A retry succeeds.
      ASSERT_TRUE(SaveSync(dir, 2, model2).ok());
      ExpectHolds(dir, 2, model2);
    }
  }
  LOG(INFO) << name << ": " << ops.size() << " operations per save, " << tried
            << " injected failures, nothing lost";
}

// Saving iteration 2 again (a resumed run), each step failing in turn:
// whatever the tracker names loads, old or new copy, before and after the
// writer's repair, and nothing is left only as .old once repaired.
TEST(WriteFailureTest, EveryFailedStepOfAReSaveLosesNothing) {
  const auto model1 = Model(100), model2 = Model(200), model3 = Model(300);
  FaultInjectingFileSystem fs;
  std::vector<FileOpRecord> ops;
  const std::string count_dir = FreshDir("resave_count");
  ASSERT_TRUE(SaveSync(count_dir, 1, model1).ok());
  ASSERT_TRUE(SaveSync(count_dir, 2, model2).ok());
  {
    ScopedFileSystem scoped(&fs);
    fs.FailOperation(-1, testing::Fault::kIoError);
    ASSERT_TRUE(SaveSync(count_dir, 2, model3).ok());
    ops = fs.operations();
  }
  bool renamed_aside = false;
  for (const FileOpRecord& op : ops) {
    renamed_aside |= op.op == FileOp::kRename &&
                     absl::StrContains(op.path, "iter_0000002.old");
  }
  ASSERT_TRUE(renamed_aside) << "the re-save moved nothing aside";
  for (size_t k = 0; k < ops.size(); ++k) {
    for (testing::Fault fault : FaultsFor(ops[k].op)) {
      SCOPED_TRACE(absl::StrCat(
          "operation ", k, " (", testing::FileOpName(ops[k].op), " ",
          ops[k].path, ") fails with ", testing::FaultName(fault)));
      const std::string dir = FreshDir(absl::StrCat("resave_", k));
      ASSERT_TRUE(SaveSync(dir, 1, model1).ok());
      ASSERT_TRUE(SaveSync(dir, 2, model2).ok());
      {
        ScopedFileSystem scoped(&fs);
        fs.FailOperation(static_cast<int64_t>(k), fault);
        (void)SaveSync(dir, 2, model3);
        ASSERT_TRUE(fs.fired());
      }
      auto holds_old_or_new = [&] {
        auto reader = CheckpointReader::Open(dir);
        ASSERT_TRUE(reader.ok()) << reader.status();
        ASSERT_EQ((*reader)->iteration(), 2);
        auto a = (*reader)->ReadTensor("a");
        ASSERT_TRUE(a.ok()) << a.status();
        const auto& want =
            a->ToDoubles() == model2[0].local.ToDoubles() ? model2 : model3;
        ExpectHolds(dir, 2, want);
      };
      holds_old_or_new();
      ASSERT_TRUE(RepairCheckpointDir(dir).ok());
      EXPECT_TRUE(file_util::Exists(dir + "/iter_0000002/metadata.pb"));
      EXPECT_FALSE(file_util::Exists(dir + "/iter_0000002.old"));
      holds_old_or_new();
      ExpectHolds(dir, 1, model1);
      ASSERT_TRUE(SaveSync(dir, 2, model3).ok());
      ExpectHolds(dir, 2, model3);
    }
  }
}

TEST(WriteFailureTest, EveryFailedStepOfASyncSaveLosesNothing) {
  RunEveryFailure("sync", &SaveSync);
}

TEST(WriteFailureTest, EveryFailedStepOfAnAsyncSaveLosesNothing) {
  RunEveryFailure("async", &SaveAsync);
}

}  // namespace
}  // namespace mcc
