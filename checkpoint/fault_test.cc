// Faults: a save killed part-way, a flipped byte, a missing or truncated
// shard file, corrupt metadata, a full disk.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/file_util.h"
#include "checkpoint/in_process_group.h"
#include "checkpoint/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using testing_util::FreshDir;
using testing_util::RandomTensor;

std::vector<ShardedTensorRef> Model(uint32_t seed) {
  return {ShardedTensorRef::Replicated(
              "a", RandomTensor({64, 32}, DType::kFloat32, seed)),
          ShardedTensorRef::Replicated(
              "b", RandomTensor({128}, DType::kBFloat16, seed + 1)),
          ShardedTensorRef::Replicated(
              "c", RandomTensor({16, 16}, DType::kFloat32, seed + 2))};
}

absl::Status Save(const std::string& dir, int64_t it,
                  const std::vector<ShardedTensorRef>& refs,
                  const SaveOptions& opts = {}) {
  return SaveCheckpoint(dir, it, refs, {}, {}, DistContext::Single(), opts);
}

// The checkpoint `latest` names is iteration `it` and holds refs' values.
void ExpectLoads(const std::string& dir, int64_t it,
                 const std::vector<ShardedTensorRef>& refs) {
  auto latest = LatestIteration(dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, it);
  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const auto& ref : refs) {
    auto t = (*reader)->ReadTensor(ref.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->ToDoubles(), ref.local.ToDoubles()) << ref.name;
  }
}

// Forks a child that saves iteration 2 and stops at the first progress event
// that starts with `stage`; the parent SIGKILLs it there.
void KillSaveAt(const std::string& dir, const std::string& stage) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    SaveOptions opts;
    opts.progress_hook = [&](absl::string_view event) {
      if (absl::StartsWith(event, stage)) {
        (void)!write(fds[1], "x", 1);
        while (true) pause();
      }
    };
    (void)Save(dir, 2, Model(200), opts);
    _exit(3);  // The hook never fired.
  }
  close(fds[1]);
  char c;
  ASSERT_EQ(read(fds[0], &c, 1), 1)
      << "the child finished without reaching " << stage;
  close(fds[0]);
  kill(pid, SIGKILL);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus));
}

TEST(FaultTest, KilledSaveLeavesPreviousCheckpoint) {
  for (const std::string stage :
       {"shard a", "shard c", "files_synced", "metadata_written"}) {
    SCOPED_TRACE(stage);
    const std::string dir = FreshDir("killed");
    const auto model1 = Model(100);
    ASSERT_TRUE(Save(dir, 1, model1).ok());
    KillSaveAt(dir, stage);
    // The killed save left its temporary directory; nothing else changed.
    EXPECT_TRUE(file_util::Exists(dir + "/iter_0000002.tmp"));
    EXPECT_FALSE(file_util::Exists(dir + "/iter_0000002"));
    EXPECT_EQ(ListCheckpoints(dir), std::vector<int64_t>{1});
    ExpectLoads(dir, 1, model1);
    EXPECT_FALSE(CheckpointReader::Open(dir, 2).ok());
    // The next save cleans up and succeeds.
    const auto model2 = Model(300);
    ASSERT_TRUE(Save(dir, 2, model2).ok());
    EXPECT_FALSE(file_util::Exists(dir + "/iter_0000002.tmp"));
    ExpectLoads(dir, 2, model2);
  }
}

TEST(FaultTest, KilledAfterCommitHasNewCheckpoint) {
  const std::string dir = FreshDir("killed_after");
  ASSERT_TRUE(Save(dir, 1, Model(100)).ok());
  KillSaveAt(dir, "committed");
  ExpectLoads(dir, 2, Model(200));
}

// A re-save of the iteration `latest` names, killed between moving the old
// copy aside and renaming the new one in, in every way: by the test hook,
// and by the failure-injection variable a real job would be killed with.
TEST(FaultTest, ResaveKilledBetweenItsRenamesIsRestored) {
  for (const bool by_env : {false, true}) {
    SCOPED_TRACE(by_env ? "MCC_CHAOS_KILL_AT_SAVE" : "progress hook");
    const std::string dir = FreshDir("resave_killed");
    const auto model = Model(100);
    ASSERT_TRUE(Save(dir, 2, model).ok());
    if (by_env) {
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        setenv("MCC_CHAOS_KILL_AT_SAVE", "old_moved_aside", 1);
        (void)Save(dir, 2, Model(200));
        _exit(3);  // Not killed: the event never came.
      }
      int wstatus = 0;
      ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
      ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
          << "child status " << wstatus;
    } else {
      KillSaveAt(dir, "old_moved_aside");
    }
    // The only copy is iter_2.old, with the new save's directory beside it.
    ASSERT_FALSE(file_util::Exists(dir + "/iter_0000002"));
    ASSERT_TRUE(file_util::Exists(dir + "/iter_0000002.old/metadata.pb"));
    ASSERT_TRUE(file_util::Exists(dir + "/iter_0000002.tmp"));
    // A reader (eval, a run loading another run's directory) reads .old in
    // place, bit-exact.
    ExpectLoads(dir, 2, model);
    // The writer's next start puts it back and clears the temporaries.
    ASSERT_TRUE(RepairCheckpointDir(dir).ok());
    EXPECT_TRUE(file_util::Exists(dir + "/iter_0000002/metadata.pb"));
    EXPECT_FALSE(file_util::Exists(dir + "/iter_0000002.old"));
    EXPECT_FALSE(file_util::Exists(dir + "/iter_0000002.tmp"));
    EXPECT_EQ(ListCheckpoints(dir), std::vector<int64_t>{2});
    ExpectLoads(dir, 2, model);
  }
}

// Killed after the new copy is in but before .old is removed: both are
// complete, the new one loads, and the writer's next start removes .old.
TEST(FaultTest, ResaveKilledBeforeRemovingOldLoadsTheNewCopy) {
  const std::string dir = FreshDir("resave_both");
  const std::string other = FreshDir("resave_both_old");
  ASSERT_TRUE(Save(other, 2, Model(100)).ok());
  ASSERT_TRUE(Save(dir, 2, Model(200)).ok());
  ASSERT_TRUE(
      file_util::Rename(other + "/iter_0000002", dir + "/iter_0000002.old")
          .ok());
  ExpectLoads(dir, 2, Model(200));
  ASSERT_TRUE(Save(dir, 3, Model(300)).ok());
  EXPECT_FALSE(file_util::Exists(dir + "/iter_0000002.old"));
  EXPECT_EQ(ListCheckpoints(dir), (std::vector<int64_t>{2, 3}));
  auto r2 = CheckpointReader::Open(dir, 2);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ((*r2)->ReadTensor("a")->ToDoubles(),
            Model(200)[0].local.ToDoubles());
}

TEST(FaultTest, FlippedByteIsAChecksumErrorNamingFileAndTensor) {
  const std::string dir = FreshDir("flip");
  const auto model = Model(7);
  ASSERT_TRUE(Save(dir, 1, model).ok());
  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok());
  auto rec = (*reader)->FindTensor("b");
  ASSERT_TRUE(rec.ok());
  const auto& shard = (*rec)->shards(0);
  const std::string path = dir + "/iter_0000001/" + shard.file();
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(shard.byte_offset() + 17);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(shard.byte_offset() + 17);
    f.write(&c, 1);
  }
  auto reopened = CheckpointReader::Open(dir);
  ASSERT_TRUE(reopened.ok());
  auto t = (*reopened)->ReadTensor("b");
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::IsDataLoss(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("checksum mismatch"), std::string::npos);
  EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("tensor b"), std::string::npos);
  // The other tensors in the same file still load.
  EXPECT_TRUE((*reopened)->ReadTensor("a").ok());
  EXPECT_TRUE((*reopened)->ReadTensor("c").ok());
}

TEST(FaultTest, MissingAndTruncatedShardFiles) {
  const std::string dir = FreshDir("missing");
  // Two ranks, each writing half of "w" (split along dim 0).
  Tensor full = RandomTensor({8, 4}, DType::kFloat32, 3);
  InProcessGroup group(2);
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ShardedTensorRef ref{
          "w", {8, 4}, {4 * r, 0}, *full.Slice(4 * r, 4 * r + 4)};
      status[r] = SaveCheckpoint(dir, 1, {ref}, {}, {}, group.Context(r));
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(status[0].ok() && status[1].ok()) << status[0] << status[1];
  const std::string file1 = dir + "/iter_0000001/" + ShardFileName(1);
  ASSERT_TRUE(file_util::Exists(file1));

  // Truncated.
  ASSERT_EQ(truncate(file1.c_str(), 10), 0);
  {
    auto reader = CheckpointReader::Open(dir);
    ASSERT_TRUE(reader.ok());
    auto t = (*reader)->ReadTensor("w");
    EXPECT_TRUE(absl::IsDataLoss(t.status())) << t.status();
    EXPECT_NE(t.status().message().find("truncated"), std::string::npos);
    // The half in rank 0's file still reads.
    Tensor top = Tensor::Zeros({4, 4}, DType::kFloat32);
    ASSERT_TRUE((*reader)->ReadRegion("w", {0, 0}, &top).ok());
    EXPECT_EQ(top.ToDoubles(), full.Slice(0, 4)->ToDoubles());
  }
  // Missing.
  ASSERT_EQ(unlink(file1.c_str()), 0);
  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok());
  auto t = (*reader)->ReadTensor("w");
  EXPECT_TRUE(absl::IsNotFound(t.status())) << t.status();
  EXPECT_NE(t.status().message().find(file1), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("tensor w"), std::string::npos);
}

TEST(FaultTest, CorruptOrMissingMetadata) {
  const std::string dir = FreshDir("meta");
  ASSERT_TRUE(Save(dir, 1, Model(1)).ok());
  const std::string meta = dir + "/iter_0000001/metadata.pb";
  ASSERT_TRUE(
      file_util::WriteFileAtomically(meta, "\xff\xff\xff garbage").ok());
  auto r = CheckpointReader::Open(dir);
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  EXPECT_NE(r.status().message().find(meta), std::string::npos);
  ASSERT_EQ(unlink(meta.c_str()), 0);
  r = CheckpointReader::Open(dir);
  // The tracker names an incomplete checkpoint: an error naming both.
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("incomplete"), std::string::npos);
  EXPECT_NE(r.status().message().find(kLatestFileName), std::string::npos);
  EXPECT_NE(r.status().message().find(dir + "/iter_0000001"),
            std::string::npos);
  ASSERT_TRUE(
      file_util::WriteFileAtomically(dir + "/" + kLatestFileName, "x1\n").ok());
  EXPECT_TRUE(absl::IsDataLoss(CheckpointReader::Open(dir).status()));
}

TEST(FaultTest, FullDiskFailsAndKeepsPreviousCheckpoint) {
  // RLIMIT_FSIZE with SIGXFSZ ignored makes write() fail with EFBIG past
  // the limit, as a full disk makes it fail with ENOSPC.
  const std::string dir = FreshDir("full");
  const auto model1 = Model(1);
  ASSERT_TRUE(Save(dir, 1, model1).ok());
  std::vector<ShardedTensorRef> big = {ShardedTensorRef::Replicated(
      "big", RandomTensor({256, 1024}, DType::kFloat32, 9))};
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct sigaction ignore = {}, old_action;
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &old_action), 0);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  const absl::Status s = Save(dir, 2, big);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ASSERT_EQ(sigaction(SIGXFSZ, &old_action, nullptr), 0);

  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("tensor big"), std::string::npos) << s;
  EXPECT_NE(s.message().find(ShardFileName(0)), std::string::npos) << s;
  EXPECT_FALSE(file_util::Exists(dir + "/iter_0000002"));
  EXPECT_FALSE(file_util::Exists(dir + "/iter_0000002.tmp"));
  ExpectLoads(dir, 1, model1);
}

}  // namespace
}  // namespace mcc
