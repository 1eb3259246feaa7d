// The flight recorder in real processes: ranks that time out dump their
// rings, and the analysis names the rank that is behind.
#include "core/comm/flight_recorder.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/comm/hang_analysis.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

using ::testing::HasSubstr;
using testing::RunWorkers;
using testing::WorkerResult;

absl::StatusOr<World> Init() {
  GroupOptions options;
  options.timeout = absl::Seconds(3);
  return InitWorldFromEnvironment(options);
}

int Fail(const absl::Status& s) {
  fprintf(stderr, "ERROR: %s\n", s.ToString().c_str());
  return 3;
}

// Three all-reduces; the last rank, before the third, either posts a receive
// that no one sends (skip) or stops itself (stop).
int RunScenario(bool stop) {
  absl::StatusOr<World> world = Init();
  if (!world.ok()) return Fail(world.status());
  ProcessGroup& g = *world->group;
  Tensor t = Tensor::Full({16}, 1.0, DType::kFloat32);
  for (int i = 0; i < 3; ++i) {
    if (g.rank() == g.size() - 1 && i == 2) {
      if (stop) raise(SIGSTOP);
      Tensor r = Tensor::Zeros({4}, DType::kFloat32);
      CollectiveOptions opts;
      opts.timeout = absl::Seconds(3);
      return Fail(g.RecvSync(&r, 0, /*tag=*/7, opts));
    }
    absl::Status s = g.AllReduceSync(&t, ReduceOp::kSum);
    if (!s.ok()) return Fail(s);
  }
  return 0;
}

MCC_WORKER(skip) { return RunScenario(false); }
MCC_WORKER(stop) { return RunScenario(true); }

std::map<std::string, std::string> ReadDumps(const std::string& dir) {
  std::map<std::string, std::string> dumps;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path());
    std::stringstream buf;
    buf << in.rdbuf();
    dumps[e.path().filename().string()] = buf.str();
  }
  return dumps;
}

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/fr_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(FlightRecorderTest, NamesTheRankThatSkippedACollective) {
  const std::string dir = FreshDir("skip");
  std::vector<WorkerResult> results =
      RunWorkers(3, "skip", absl::Seconds(40), [&](int) {
        return std::map<std::string, std::string>{
            {"MCC_FLIGHT_RECORDER_DIR", dir}};
      });
  for (const WorkerResult& w : results) {
    EXPECT_EQ(w.exit_code, 3) << testing::Describe(results);
  }
  std::map<std::string, std::string> dumps = ReadDumps(dir);
  ASSERT_EQ(dumps.size(), 3u) << testing::Describe(results);
  absl::StatusOr<std::vector<std::string>> findings = AnalyzeHang(dumps, 3);
  ASSERT_TRUE(findings.ok()) << findings.status();
  EXPECT_THAT(absl::StrJoin(*findings, "\n"),
              HasSubstr("ranks 0-1 wait in AllReduce #2 of group 'world'; "
                        "rank 2 last finished #1 of group 'world' and is in "
                        "Recv (p2p #0) from rank 0 of group 'world'"));
}

TEST(FlightRecorderTest, NamesTheRankThatStopped) {
  const std::string dir = FreshDir("stop");
  std::vector<WorkerResult> results =
      RunWorkers(3, "stop", absl::Seconds(15), [&](int) {
        return std::map<std::string, std::string>{
            {"MCC_FLIGHT_RECORDER_DIR", dir}};
      });
  EXPECT_TRUE(results[2].timed_out) << testing::Describe(results);
  std::map<std::string, std::string> dumps = ReadDumps(dir);
  ASSERT_EQ(dumps.size(), 2u) << testing::Describe(results);
  absl::StatusOr<std::vector<std::string>> findings = AnalyzeHang(dumps, 3);
  ASSERT_TRUE(findings.ok()) << findings.status();
  EXPECT_THAT((*findings)[0],
              HasSubstr("ranks 0-1 wait in AllReduce #2 of group 'world'; "
                        "rank 2 left no dump"));
}

MCC_WORKER(usr1) {
  absl::StatusOr<World> world = Init();
  if (!world.ok()) return Fail(world.status());
  Tensor t = Tensor::Full({4}, 1.0, DType::kFloat32);
  absl::Status s = world->group->AllReduceSync(&t, ReduceOp::kSum);
  if (!s.ok()) return Fail(s);
  FlightRecorder::Global().SetDumpDirectory(std::getenv("DUMP_DIR"),
                                            world->group->rank());
  raise(SIGUSR1);
  const std::string path =
      absl::StrCat(std::getenv("DUMP_DIR"), "/flight_recorder_rank",
                   world->group->rank(), ".json");
  for (int i = 0; i < 200 && !std::filesystem::exists(path); ++i) {
    usleep(10000);
  }
  return std::filesystem::exists(path) ? 0 : 4;
}

TEST(FlightRecorderTest, Sigusr1DumpsAndTheJobGoesOn) {
  const std::string dir = FreshDir("usr1");
  std::vector<WorkerResult> results =
      RunWorkers(2, "usr1", absl::Seconds(30), [&](int) {
        return std::map<std::string, std::string>{{"DUMP_DIR", dir}};
      });
  for (const WorkerResult& w : results) {
    EXPECT_EQ(w.exit_code, 0) << testing::Describe(results);
  }
  std::map<std::string, std::string> dumps = ReadDumps(dir);
  ASSERT_EQ(dumps.size(), 2u);
  EXPECT_THAT(dumps.begin()->second, HasSubstr("\"state\": \"completed\""));
  EXPECT_THAT(dumps.begin()->second, HasSubstr("signal 10"));
}

TEST(FlightRecorderTest, RingKeepsTheLastEntries) {
  FlightRecorder& r = FlightRecorder::Global();
  r.set_capacity(3);
  for (int i = 0; i < 5; ++i) {
    FlightRecord rec;
    rec.op = "AllReduce";
    rec.seq = i;
    const int64_t id = r.Start(rec);
    if (i < 4) r.Finish(id, absl::OkStatus());
  }
  std::vector<FlightRecord> snap = r.Snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_EQ(snap[0].seq, 2);
  EXPECT_EQ(snap[1].state, "completed");
  EXPECT_EQ(snap[2].state, "started");
  EXPECT_EQ(snap[2].end_us, -1);
}

}  // namespace
}  // namespace comm
}  // namespace mcc
