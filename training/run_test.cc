#include "training/run.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "training/run_options.h"
#include "training/testing/tiny_run.h"

namespace mcc {
namespace training {
namespace {

// A tiny run on mock data, one process.
TrainConfig TinyConfig(const std::string& dir) {
  TrainConfig config = testing::TinyRunConfig(dir);
  config.set_eval_interval(3);
  config.set_eval_iters(1);
  config.set_save_interval(3);
  config.set_save(dir + "/ckpt");
  config.set_metrics_file(dir + "/metrics.jsonl");
  return config;
}

// The "loss" of each line of a metrics file.
std::vector<double> LoggedLosses(const std::string& path) {
  std::vector<double> losses;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("\"loss\": ");
    if (at == std::string::npos) continue;
    std::string value = line.substr(at + 8);
    value = value.substr(0, value.find(','));
    double v = 0;
    if (absl::SimpleAtod(value, &v)) losses.push_back(v);
  }
  return losses;
}

std::unique_ptr<ExitConditions> NoEarlyExit(const TrainConfig& config) {
  return std::move(*ExitConditions::Create(*ExitOptionsFromConfig(config),
                                           absl::Now(), nullptr));
}

TEST(RunTest, HooksSeeEveryStageAndTheLoggedLosses) {
  const std::string dir = ::testing::TempDir() + "/run_hooks";
  std::remove((dir + "/metrics.jsonl").c_str());
  const TrainConfig config = TinyConfig(dir);
  ASSERT_TRUE(CheckTrainConfig(config, 1).ok());
  std::vector<std::string> events;
  std::vector<double> step_losses;
  RunHooks hooks;
  hooks.after_setup = [&](Job& job, Trainer&, int64_t first) {
    EXPECT_EQ(job.world_size, 1);
    events.push_back(absl::StrCat("setup ", first));
    return absl::OkStatus();
  };
  hooks.after_step = [&](const StepMetrics& step) {
    events.push_back(absl::StrCat("step ", step.iteration));
    step_losses.push_back(step.loss);
    return absl::OkStatus();
  };
  hooks.after_evaluation = [&](int64_t iteration, double loss) {
    EXPECT_GT(loss, 0);
    events.push_back(absl::StrCat("eval ", iteration));
    return absl::OkStatus();
  };
  hooks.after_save = [&](int64_t iteration, const std::string& save_dir) {
    EXPECT_EQ(save_dir, config.save());
    events.push_back(absl::StrCat("save ", iteration));
    return absl::OkStatus();
  };
  auto exit = NoEarlyExit(config);
  ASSERT_TRUE(training::Run(config, exit.get(), hooks).ok());
  EXPECT_EQ(events,
            (std::vector<std::string>{"setup 1", "step 1", "step 2", "step 3",
                                      "eval 3", "save 3", "step 4", "step 5",
                                      "step 6", "eval 6", "save 6"}));
  // With log_interval 1 the metrics file logs each step's loss (as %g-ish
  // text), so the hook's values must round to it.
  const std::vector<double> logged = LoggedLosses(config.metrics_file());
  ASSERT_EQ(logged.size(), step_losses.size());
  for (size_t i = 0; i < logged.size(); ++i) {
    EXPECT_NEAR(logged[i], step_losses[i], 1e-6 * std::max(1.0, logged[i]));
  }
}

TEST(RunTest, AHookErrorStopsTheRunWithIt) {
  const std::string dir = ::testing::TempDir() + "/run_hook_error";
  const TrainConfig config = TinyConfig(dir);
  RunHooks hooks;
  int steps = 0;
  hooks.after_step = [&](const StepMetrics& step) {
    ++steps;
    return step.iteration == 2 ? absl::AbortedError("stop at 2")
                               : absl::OkStatus();
  };
  auto exit = NoEarlyExit(config);
  const absl::Status s = training::Run(config, exit.get(), hooks);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(steps, 2);
}

}  // namespace
}  // namespace training
}  // namespace mcc
