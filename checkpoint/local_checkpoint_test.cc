// Local checkpoints in real processes over gloo: a toy training loop (a
// row-split weight, its momentum and a per-rank RNG) saves every 3
// iterations, stops after iteration 7 as a killed job would, and a restart
// resumes from the local copies, from peers' copies where a rank's are
// deleted, torn or corrupt, and must then match the uninterrupted run bit
// for bit.
#include "checkpoint/local_checkpoint.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/comm_dist_context.h"
#include "core/crc32c.h"
#include "checkpoint/file_util.h"
#include "checkpoint/test_util.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using comm::testing::Describe;
using comm::testing::ReportFailure;
using comm::testing::RunWorkers;
using comm::testing::WorkerResult;

constexpr int64_t kRows = 4;  // Per rank.
constexpr int64_t kCols = 8;

std::string Env(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

int EnvInt(const char* name, int fallback) {
  int v = 0;  // SimpleAtoi writes 0 when it fails.
  return absl::SimpleAtoi(Env(name), &v) ? v : fallback;
}

std::string NodeDir(const std::string& root, int rank, int ranks_per_node) {
  return file_util::JoinPath(root, absl::StrCat("node", rank / ranks_per_node));
}

// Runs the toy training to LC_ITERS, saving local checkpoints every
// LC_INTERVAL, restoring first (LC_PERSISTENT: the shared directory's
// iteration, -1 none), and stopping without a save after LC_STOP_AFTER.
// Writes what it did to LC_OUT/rank_R.txt.
int RunToy() {
  comm::GroupOptions group_options;
  group_options.timeout = absl::Seconds(60);
  absl::StatusOr<comm::World> world =
      comm::InitWorldFromEnvironment(group_options);
  if (!world.ok()) return ReportFailure("init", world.status(), 1);
  comm::ProcessGroup* group = world->group.get();
  const int rank = group->rank();
  const int n = group->size();
  const int ranks_per_node = EnvInt("LC_RANKS_PER_NODE", n);
  const int iters = EnvInt("LC_ITERS", 10);
  const int interval = EnvInt("LC_INTERVAL", 3);
  const int stop_after = EnvInt("LC_STOP_AFTER", iters);
  const int persistent = EnvInt("LC_PERSISTENT", -1);

  LocalCheckpointOptions options;
  options.dir = NodeDir(Env("LC_DIR"), rank, ranks_per_node);
  options.replicate = true;
  options.ranks_per_node = ranks_per_node;
  auto local =
      LocalCheckpointer::Create(options, MakeProcessGroupDistContext(group));
  if (!local.ok()) return ReportFailure("create", local.status(), 1);

  Tensor w =
      testing_util::RandomTensor({kRows, kCols}, DType::kFloat32, 100 + rank);
  Tensor m = Tensor::Zeros({kRows, kCols}, DType::kFloat32);
  std::mt19937 rng(7 + rank);
  auto refs = [&]() {
    return std::vector<ShardedTensorRef>{
        ShardedTensorRef::SplitAlong("w", w, 0, rank, n),
        ShardedTensorRef::SplitAlong("optimizer.momentum.w", m, 0, rank, n)};
  };
  std::ostringstream report;
  int64_t iteration = 0;
  auto restore = (*local)->PrepareRestore(
      persistent >= 0 ? std::optional<int64_t>(persistent) : std::nullopt);
  if (!restore.ok()) return ReportFailure("restore", restore.status(), 1);
  if (restore->has_value()) {
    const LocalRestore& at = **restore;
    auto reader = CheckpointReader::Open(at.dir);
    if (!reader.ok()) return ReportFailure("open", reader.status(), 1);
    if (absl::Status s = (*reader)->Load(refs()); !s.ok()) {
      return ReportFailure("load", s, 1);
    }
    auto state = (*reader)->RankStateOf(0);
    if (!state.ok()) return ReportFailure("rank state", state.status(), 1);
    std::istringstream(state->rng_states().at("toy")) >> rng;
    iteration = (*reader)->common_state().iteration();
    report << "restored " << iteration << " " << at.from_peer << "\n";
    for (const std::string& r : at.refused) report << "refused " << r << "\n";
  } else {
    report << "restored none\n";
  }
  while (iteration < std::min(iters, stop_after)) {
    ++iteration;
    float* pw = w.data<float>();
    float* pm = m.data<float>();
    std::uniform_real_distribution<float> noise(-0.01f, 0.01f);
    for (int64_t i = 0; i < w.numel(); ++i) {
      const float g = std::sin(pw[i] * 0.1f + iteration) + noise(rng);
      pm[i] = 0.9f * pm[i] + g;
      pw[i] -= 0.01f * pm[i];
    }
    double sum = 0;
    for (int64_t i = 0; i < w.numel(); ++i) sum += pw[i] * pw[i];
    Tensor loss = Tensor::Full({1}, sum, DType::kFloat32);
    if (absl::Status s = group->AllReduceSync(&loss, comm::ReduceOp::kSum);
        !s.ok()) {
      return ReportFailure("all-reduce", s, 1);
    }
    uint32_t bits;
    std::memcpy(&bits, loss.raw_data(), 4);
    report << "loss " << iteration << " " << bits << "\n";
    if (iteration % interval == 0 && iteration < stop_after) {
      checkpoint::CommonState common;
      common.set_iteration(iteration);
      checkpoint::RankState state;
      std::ostringstream rng_state;
      rng_state << rng;
      (*state.mutable_rng_states())["toy"] = rng_state.str();
      if (absl::Status s = (*local)->Save(iteration, refs(), common, state);
          !s.ok()) {
        return ReportFailure("save", s, 1);
      }
    }
  }
  report << "final " << Crc32c(w.raw_data(), w.nbytes()) << " "
         << Crc32c(m.raw_data(), m.nbytes()) << "\n";
  std::ofstream(
      file_util::JoinPath(Env("LC_OUT"), absl::StrCat("rank_", rank, ".txt")))
      << report.str();
  return 0;
}

MCC_WORKER(local_toy) { return RunToy(); }

struct Report {
  std::string restored;  // "none" or "<iteration> <from_peer>"
  std::vector<std::string> refused;
  std::map<int, std::string> losses;
  std::string final_state;
};

Report ReadReport(const std::string& out, int rank) {
  Report r;
  std::ifstream in(
      file_util::JoinPath(out, absl::StrCat("rank_", rank, ".txt")));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "restored ")) r.restored = line.substr(9);
    if (absl::StartsWith(line, "refused ")) r.refused.push_back(line.substr(8));
    if (absl::StartsWith(line, "final ")) r.final_state = line.substr(6);
    if (absl::StartsWith(line, "loss ")) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      int it = 0;
      if (f.size() == 3 && absl::SimpleAtoi(f[1], &it)) r.losses[it] = f[2];
    }
  }
  return r;
}

class LocalCheckpointTest : public ::testing::Test {
 protected:
  static constexpr int kWorld = 4;
  static constexpr int kRanksPerNode = 2;

  // Runs the toy job over `dir` (saving in dir/ckpt) and returns each
  // rank's report.
  std::vector<Report> Run(const std::string& dir, const std::string& name,
                          std::map<std::string, std::string> env,
                          int world = kWorld,
                          int ranks_per_node = kRanksPerNode) {
    const std::string out = file_util::JoinPath(dir, name);
    EXPECT_TRUE(file_util::MakeDirs(out).ok());
    env["LC_DIR"] = file_util::JoinPath(dir, "ckpt");
    env["LC_OUT"] = out;
    env["LC_RANKS_PER_NODE"] = std::to_string(ranks_per_node);
    std::vector<WorkerResult> results = RunWorkers(
        world, "local_toy", absl::Seconds(120), [&](int) { return env; });
    std::vector<Report> reports;
    for (const WorkerResult& r : results) {
      EXPECT_EQ(r.exit_code, 0) << Describe(results);
      reports.push_back(ReadReport(out, r.rank));
    }
    return reports;
  }

  // The uninterrupted run, once per test.
  std::vector<Report> Reference(int world = kWorld,
                                int ranks_per_node = kRanksPerNode) {
    return Run(testing_util::FreshDir("reference"), "out", {}, world,
               ranks_per_node);
  }

  // Stops after iteration 7 (local saves at 3 and 6), lets `damage` act on
  // the directory, restarts and returns the restart's reports.
  std::vector<Report> KillDamageRestart(
      const std::string& name,
      const std::function<void(const std::string&)>& damage, int world = kWorld,
      int ranks_per_node = kRanksPerNode) {
    const std::string dir = testing_util::FreshDir(name);
    std::vector<Report> first =
        Run(dir, "first", {{"LC_STOP_AFTER", "7"}}, world, ranks_per_node);
    for (const Report& r : first) EXPECT_EQ(r.restored, "none");
    damage(file_util::JoinPath(dir, "ckpt"));
    return Run(dir, "second", {}, world, ranks_per_node);
  }

  // Every rank resumed at `iteration` and then matched the reference.
  void ExpectResumedIdentically(const std::vector<Report>& resumed,
                                const std::vector<Report>& reference,
                                int iteration) {
    ASSERT_EQ(resumed.size(), reference.size());
    for (size_t r = 0; r < resumed.size(); ++r) {
      EXPECT_TRUE(
          absl::StartsWith(resumed[r].restored, absl::StrCat(iteration, " ")))
          << "rank " << r << " restored " << resumed[r].restored;
      EXPECT_EQ(resumed[r].losses.begin()->first, iteration + 1);
      for (const auto& [it, loss] : resumed[r].losses) {
        EXPECT_EQ(loss, reference[r].losses.at(it))
            << "rank " << r << " iteration " << it;
      }
      EXPECT_EQ(resumed[r].final_state, reference[r].final_state)
          << "rank " << r;
    }
  }
};

TEST_F(LocalCheckpointTest, ResumesFromOwnCopiesBitIdentical) {
  std::vector<Report> reference = Reference();
  std::vector<Report> resumed =
      KillDamageRestart("own", [](const std::string&) {});
  ExpectResumedIdentically(resumed, reference, 6);
  for (const Report& r : resumed) {
    EXPECT_EQ(r.restored, "6 0");
    EXPECT_TRUE(r.refused.empty());
  }
}

TEST_F(LocalCheckpointTest, LostNodeRestoresFromPeersOnTheOtherNode) {
  std::vector<Report> reference = Reference();
  // Node 1 (ranks 2 and 3) comes back with an empty local disk; their
  // replicas sit with ranks 0 and 1 on node 0 (jump = ranks per node).
  std::vector<Report> resumed =
      KillDamageRestart("lost_node", [](const std::string& ckpt) {
        ASSERT_TRUE(file_util::RemoveAll(ckpt + "/node1").ok());
      });
  ExpectResumedIdentically(resumed, reference, 6);
  EXPECT_EQ(resumed[0].restored, "6 0");
  EXPECT_EQ(resumed[1].restored, "6 0");
  EXPECT_EQ(resumed[2].restored, "6 1");
  EXPECT_EQ(resumed[3].restored, "6 1");
}

TEST_F(LocalCheckpointTest, CorruptAndTornCopiesAreRefusedNamingTheFile) {
  std::vector<Report> reference = Reference();
  const std::string shard = "node0/rank_00001/iter_0000006/shard_r00000.bin";
  std::vector<Report> resumed =
      KillDamageRestart("corrupt", [&](const std::string& ckpt) {
        // Rank 1: one flipped byte in its shard.
        std::fstream f(file_util::JoinPath(ckpt, shard),
                       std::ios::in | std::ios::out | std::ios::binary);
        ASSERT_TRUE(f.good());
        f.seekg(70);
        char c = 0;
        f.read(&c, 1);
        c ^= 0x10;
        f.seekp(70);
        f.write(&c, 1);
        f.close();
        // Rank 2: a save torn before its checksum file landed.
        ASSERT_TRUE(
            file_util::RemoveAll(ckpt + "/node1/rank_00002/iter_0000006.crc")
                .ok());
      });
  ExpectResumedIdentically(resumed, reference, 6);
  EXPECT_EQ(resumed[1].restored, "6 1");
  ASSERT_EQ(resumed[1].refused.size(), 1u);
  EXPECT_TRUE(absl::StrContains(resumed[1].refused[0], shard))
      << resumed[1].refused[0];
  EXPECT_EQ(resumed[2].restored, "6 1");
  ASSERT_EQ(resumed[2].refused.size(), 1u);
  EXPECT_TRUE(
      absl::StrContains(resumed[2].refused[0], "rank_00002/iter_0000006.crc"))
      << resumed[2].refused[0];
}

TEST_F(LocalCheckpointTest, BothCopiesGoneFallsBackToTheOlderIteration) {
  std::vector<Report> reference = Reference();
  std::vector<Report> resumed =
      KillDamageRestart("both_gone", [](const std::string& ckpt) {
        // Rank 1's iteration 6, and the replica rank 3 keeps of it.
        ASSERT_TRUE(
            file_util::RemoveAll(ckpt + "/node0/rank_00001/iter_0000006").ok());
        ASSERT_TRUE(file_util::RemoveAll(
                        ckpt + "/node1/replica_of_rank_00001/iter_0000006")
                        .ok());
      });
  ExpectResumedIdentically(resumed, reference, 3);
}

TEST_F(LocalCheckpointTest, CopiesNewerThanTheResumePointAreDropped) {
  // Rank 1's iteration 6 (own and kept) is lost; the others' 6 belongs to
  // a past the resumed run does not follow: dropped, own and kept, whether
  // the run resumes from the local 3 or from a shared 4.
  for (const char* shared : {"", "4"}) {
    SCOPED_TRACE(absl::StrCat("shared iteration '", shared, "'"));
    const std::string dir =
        testing_util::FreshDir(absl::StrCat("dropped", shared));
    const std::string ckpt = file_util::JoinPath(dir, "ckpt");
    Run(dir, "first", {{"LC_STOP_AFTER", "7"}});
    ASSERT_TRUE(file_util::Exists(ckpt + "/node0/rank_00000/iter_0000006"));
    ASSERT_TRUE(
        file_util::RemoveAll(ckpt + "/node0/rank_00001/iter_0000006").ok());
    ASSERT_TRUE(
        file_util::RemoveAll(ckpt + "/node1/replica_of_rank_00001/iter_0000006")
            .ok());
    // Trains no further, so saves nothing.
    std::map<std::string, std::string> env = {{"LC_ITERS", "0"}};
    if (*shared != '\0') env["LC_PERSISTENT"] = shared;
    std::vector<Report> resumed = Run(dir, "second", env);
    for (const Report& r : resumed) {
      EXPECT_EQ(r.restored, *shared != '\0' ? "none" : "3 0");
    }
    for (const char* path : {"/node0/rank_00000/iter_0000006",
                             "/node0/rank_00000/iter_0000006.crc",
                             "/node0/replica_of_rank_00002/iter_0000006",
                             "/node1/rank_00003/iter_0000006"}) {
      EXPECT_FALSE(file_util::Exists(ckpt + path)) << path;
    }
    EXPECT_TRUE(file_util::Exists(ckpt + "/node0/rank_00000/iter_0000003.crc"));
    EXPECT_TRUE(
        file_util::Exists(ckpt + "/node0/replica_of_rank_00002/iter_0000003"));
  }
}

TEST_F(LocalCheckpointTest, NewerSharedCheckpointWins) {
  const std::string dir = testing_util::FreshDir("shared_newer");
  Run(dir, "first", {{"LC_STOP_AFTER", "7"}});
  // The shared directory holds iteration 7: the local 6 is older.
  std::vector<Report> resumed =
      Run(dir, "second", {{"LC_PERSISTENT", "7"}, {"LC_ITERS", "7"}});
  for (const Report& r : resumed) EXPECT_EQ(r.restored, "none");
  // Iteration 6 from the shared directory: the local copy is as new, and
  // read instead.
  resumed = Run(dir, "third", {{"LC_PERSISTENT", "6"}, {"LC_ITERS", "7"}});
  for (const Report& r : resumed) EXPECT_EQ(r.restored, "6 0");
}

TEST_F(LocalCheckpointTest, OneNodeCopiesToTheNextRank) {
  // Three ranks on one node: rank 0's replica is kept by rank 1.
  std::vector<Report> reference = Reference(3, 3);
  std::vector<Report> resumed = KillDamageRestart(
      "one_node",
      [](const std::string& ckpt) {
        ASSERT_TRUE(file_util::RemoveAll(ckpt + "/node0/rank_00000").ok());
      },
      3, 3);
  ExpectResumedIdentically(resumed, reference, 6);
  EXPECT_EQ(resumed[0].restored, "6 1");
  EXPECT_EQ(resumed[1].restored, "6 0");
}

TEST(LocalReplicaPeerTest, JumpsToTheNextNodeOrTheNextRank) {
  LocalCheckpointOptions o;
  EXPECT_EQ(LocalReplicaPeer(0, 4, o), -1);  // Not replicating.
  o.replicate = true;
  o.ranks_per_node = 2;
  EXPECT_EQ(LocalReplicaPeer(0, 4, o), 2);
  EXPECT_EQ(LocalReplicaPeer(3, 4, o), 1);
  o.ranks_per_node = 4;  // One node: the next rank.
  EXPECT_EQ(LocalReplicaPeer(3, 4, o), 0);
  o.replication_jump = 3;
  EXPECT_EQ(LocalReplicaPeer(2, 4, o), 1);
  o.replication_jump = 4;  // Onto itself: no replica.
  EXPECT_EQ(LocalReplicaPeer(2, 4, o), -1);
  EXPECT_EQ(LocalReplicaPeer(0, 1, o), -1);
}

}  // namespace
}  // namespace mcc
