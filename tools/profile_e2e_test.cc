// train --profile end to end: PP 2 with 4 micro-batches (1F1B, and
// interleaved with two virtual stages) in real processes under tools/launch.
// Each stage's timeline holds exactly its schedule's forwards and backwards
// (parallel/pipeline/schedules.h) in the schedule's order for every
// profiled step; the bubble computed from the trace agrees with the one
// train logs; collectives, p2p calls, waits, gradient sync, optimizer and
// data loading are on it; tools/merge_traces writes a file Python's json
// reads, and tools/plot_timeline.py draws it.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "parallel/pipeline/schedules.h"

namespace mcc {
namespace {

std::string g_launch, g_train, g_merge, g_plot;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(t != nullptr ? t : "/tmp", "/", name);
  const int made = std::system(
      absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'").c_str());
  EXPECT_EQ(made, 0) << "cannot make " << dir;
  return dir;
}

// Runs a shell command with its output in `log`; returns the exit code.
int RunShell(const std::string& command, const std::string& log) {
  const int status =
      std::system(absl::StrCat(command, " > '", log, "' 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

constexpr int kStages = 2;
constexpr int kMicroBatches = 4;
// Megatron's window: start 1, end 3 records the steps logged as 2 and 3.
const std::set<int> kProfiledSteps = {2, 3};

struct Profiled {
  std::string dir, log;
};

Profiled TrainProfiled(const std::string& name,
                       const std::vector<std::string>& extra) {
  Profiled p;
  const std::string work = TempDir(name);
  p.dir = work + "/profile";
  p.log = work + "/train.log";
  const std::vector<std::string> args = {
      g_launch, "--nproc_per_node", "2", "--", g_train, "--mock-data",
      "--vocab-size", "128", "--num-layers", "4", "--hidden-size", "64",
      "--num-attention-heads", "4", "--seq-length", "64", "--micro-batch-size",
      "2",
      // 4 micro-batches of 2.
      "--global-batch-size", "8", "--pipeline-model-parallel-size", "2",
      "--train-iters", "3", "--log-interval", "1", "--eval-iters", "0",
      "--num-threads", "1", "--peak-tflops", "1", "--profile",
      "--profile-step-start", "1", "--profile-step-end", "3", "--profile-ranks",
      "0", "1", "--profile-dir", p.dir};
  std::string command = absl::StrJoin(args, " ");
  for (const std::string& e : extra) absl::StrAppend(&command, " ", e);
  const int code = RunShell(command, p.log);
  EXPECT_EQ(code, 0) << ReadFile(p.log);
  return p;
}

// "bubble measured" per (iteration, stage) from the logging rank's lines:
// each iteration line is followed by its stages' pipeline lines.
std::map<std::pair<int, int>, double> LoggedBubbles(const std::string& log) {
  std::map<std::pair<int, int>, double> out;
  static const std::regex iteration(R"( iteration +(\d+)/)");
  static const std::regex stage(
      R"(pipeline stage (\d+)/\d+ .*bubble measured ([0-9.]+))");
  int current = -1;
  for (absl::string_view l : absl::StrSplit(log, '\n')) {
    const std::string line(l);
    std::smatch m;
    if (std::regex_search(line, m, iteration)) {
      current = std::stoi(m[1]);
    } else if (std::regex_search(line, m, stage) && current > 0) {
      out[{current, std::stoi(m[1])}] = std::stod(m[2]);
    }
  }
  return out;
}

std::string Arg(const nlohmann::json& e, const std::string& key) {
  if (!e.contains("args") || !e["args"].contains(key)) return "";
  return e["args"][key].get<std::string>();
}

void CheckTimelines(const Profiled& p, pipeline::ScheduleKind kind,
                    int chunks) {
  const std::map<std::pair<int, int>, double> logged =
      LoggedBubbles(ReadFile(p.log));
  for (int stage = 0; stage < kStages; ++stage) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    const std::string path = absl::StrCat(p.dir, "/trace_rank", stage, ".json");
    const nlohmann::json doc =
        nlohmann::json::parse(ReadFile(path), nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << path;
    ASSERT_TRUE(doc.contains("traceEvents")) << path;
    auto want =
        pipeline::BuildSchedule(kind, kStages, stage, chunks, kMicroBatches);
    ASSERT_TRUE(want.ok()) << want.status();
    std::vector<std::string> want_order;
    for (const pipeline::Action& a : *want) {
      want_order.push_back(pipeline::ActionString(a));
    }
    std::map<int, std::vector<std::pair<int64_t, std::string>>> actions;
    std::map<int, int64_t> busy, schedule_us;
    std::map<std::string, int> count_by_category;
    bool p2p_described = false;
    for (const nlohmann::json& e : doc["traceEvents"]) {
      if (e.value("ph", "") != "X") continue;
      const std::string cat = e.value("cat", "");
      ++count_by_category[cat];
      const std::string step_text = Arg(e, "step");
      const int step = step_text.empty() ? -1 : std::stoi(step_text);
      EXPECT_TRUE(kProfiledSteps.count(step))
          << e.dump() << " is outside the window";
      if (cat == "compute") {
        const std::string name = e.value("name", "");
        const std::string kind_letter = name.rfind("forward", 0) == 0    ? "F"
                                        : name.rfind("backward", 0) == 0 ? "B"
                                                                         : "?";
        actions[step].push_back({e["ts"].get<int64_t>(),
                                 absl::StrCat(kind_letter, Arg(e, "microbatch"),
                                              ".", Arg(e, "chunk"))});
        busy[step] += e["dur"].get<int64_t>();
      } else if (cat == "schedule") {
        EXPECT_EQ(schedule_us.count(step), 0u) << "two schedules in a step";
        schedule_us[step] = e["dur"].get<int64_t>();
      } else if (cat == "p2p") {
        p2p_described |= Arg(e, "group").size() > 0 &&
                         std::stoll(Arg(e, "bytes")) > 0 &&
                         Arg(e, "seq").size() > 0;
      }
    }
    for (int step : kProfiledSteps) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      auto& seen = actions[step];
      std::sort(seen.begin(), seen.end());
      std::vector<std::string> order;
      for (const auto& [ts, action] : seen) order.push_back(action);
      EXPECT_EQ(order, want_order);
      ASSERT_GT(schedule_us[step], 0);
      const double traced = 1.0 - static_cast<double>(busy[step]) /
                                      static_cast<double>(schedule_us[step]);
      ASSERT_TRUE(logged.count({step, stage})) << ReadFile(p.log);
      const double in_log = logged.at({step, stage});
      // 5% of the logged value; the log prints three decimals.
      EXPECT_NEAR(traced, in_log, std::max(0.05 * in_log, 0.001))
          << "bubble from the trace " << traced << ", logged " << in_log;
    }
    EXPECT_TRUE(p2p_described) << "no p2p event with group, bytes and seq";
    // Per step: gradient sync, optimizer step, data loading, the iteration;
    // waits on the neighbour and collectives (the loss broadcast).
    for (const char* cat : {"grad_sync", "optimizer", "data", "step"}) {
      EXPECT_EQ(count_by_category[cat], 2) << cat;
    }
    EXPECT_GT(count_by_category["wait"], 0);
    EXPECT_GT(count_by_category["comm"], 0);
  }
  // One file with a track per rank, valid JSON for Python.
  ASSERT_EQ(RunShell(absl::StrCat(g_merge, " ", p.dir), p.dir + "/merge.log"),
            0)
      << ReadFile(p.dir + "/merge.log");
  const std::string merged = p.dir + "/merged_trace.json";
  const std::string check = absl::StrCat(
      "/usr/bin/python3 -c 'import json, sys; d = "
      "json.load(open(sys.argv[1])); "
      "pids = {e[\"pid\"] for e in d[\"traceEvents\"]}; "
      "assert pids == {0, 1}, pids; print(len(d[\"traceEvents\"]))' ",
      merged);
  EXPECT_EQ(RunShell(check, p.dir + "/json.log"), 0)
      << ReadFile(p.dir + "/json.log");
  const std::string png = p.dir + "/schedule.png";
  EXPECT_EQ(RunShell(absl::StrCat("/usr/bin/python3 ", g_plot, " ", merged, " ",
                                  png, " --step 2"),
                     p.dir + "/plot.log"),
            0)
      << ReadFile(p.dir + "/plot.log");
  EXPECT_EQ(ReadFile(png).substr(1, 3), "PNG");
}

TEST(ProfileE2eTest, OneFOneBTimelineIsTheSchedule) {
  const Profiled p = TrainProfiled("1f1b", {});
  CheckTimelines(p, pipeline::ScheduleKind::kOneFOneB, 1);
}

TEST(ProfileE2eTest, InterleavedTimelineIsTheSchedule) {
  const Profiled p = TrainProfiled(
      "interleaved", {"--num-layers-per-virtual-pipeline-stage", "1"});
  CheckTimelines(p, pipeline::ScheduleKind::kInterleaved, 2);
}

TEST(ProfileE2eTest, BadWindowsAreFlagErrors) {
  const std::string work = TempDir("bad");
  const std::string base = absl::StrCat(
      g_train, " --mock-data --vocab-size 64 --num-layers 1 --hidden-size 16 ",
      "--num-attention-heads 2 --seq-length 16 --micro-batch-size 2 ",
      "--train-iters 2 --profile --profile-dir ", work, "/p");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--profile-step-start 1 --profile-step-end 1", "--profile-step-end 1"},
      {"--profile-step-start 2 --profile-step-end 3", "--profile-step-start 2"},
      {"--profile-step-start 0 --profile-step-end 1 --profile-ranks 0,1",
       "--profile-ranks: rank 1"},
  };
  for (const auto& [flags, want] : cases) {
    const std::string log = work + "/log";
    EXPECT_EQ(RunShell(absl::StrCat(base, " ", flags), log), 2)
        << ReadFile(log);
    EXPECT_NE(ReadFile(log).find(want), std::string::npos) << ReadFile(log);
  }
}

}  // namespace
}  // namespace mcc

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 5) {
    std::fprintf(stderr, "usage: profile_e2e_test LAUNCH TRAIN MERGE PLOT\n");
    return 2;
  }
  mcc::g_launch = argv[1];
  mcc::g_train = argv[2];
  mcc::g_merge = argv[3];
  mcc::g_plot = argv[4];
  return RUN_ALL_TESTS();
}
