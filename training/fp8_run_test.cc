// FP8 training end to end through training::Run (issue 43): a tiny GPT
// trains under --fp8-format hybrid (both recipes) to within 2% of the loss
// of bf16 training, and checkpoints stay format-independent: an FP8 run
// resumes without FP8 and the reverse, and tensorwise FP8 (which keeps no
// state between steps) resumes exactly where an unbroken run goes.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "training/run.h"
#include "training/run_options.h"

namespace mcc {
namespace training {
namespace {

TrainConfig TinyConfig(const std::string& dir, int64_t iters) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  TrainConfig config;
  config.set_mock_data(true);
  config.set_vocab_size(64);
  config.set_num_layers(2);
  config.set_hidden_size(64);
  config.set_num_attention_heads(4);
  config.set_seq_length(32);
  config.set_micro_batch_size(4);
  config.set_global_batch_size(8);
  config.set_train_iters(iters);
  config.set_lr(3e-3);
  config.set_lr_warmup_iters(5);
  config.set_eval_iters(0);
  config.set_log_interval(1);
  config.set_bf16(true);
  config.set_num_threads(1);
  config.set_device("cpu");
  return config;
}

void SetFp8(TrainConfig* config, const std::string& recipe) {
  config->set_fp8_format("hybrid");
  config->set_fp8_recipe(recipe);
  if (recipe == "delayed") {
    config->set_fp8_amax_history_len(16);
    config->set_fp8_amax_compute_algo("max");
  }
}

// Runs and returns the loss of every step, by iteration (index 0 unused).
std::vector<double> Train(const TrainConfig& config) {
  EXPECT_TRUE(CheckTrainConfig(config, 1).ok()) << CheckTrainConfig(config, 1);
  std::vector<double> losses(config.train_iters() + 1, NAN);
  RunHooks hooks;
  hooks.after_step = [&](const StepMetrics& step) {
    losses[step.iteration] = step.loss;
    return absl::OkStatus();
  };
  auto exit = std::move(*ExitConditions::Create(*ExitOptionsFromConfig(config),
                                                absl::Now(), nullptr));
  const absl::Status s = training::Run(config, exit.get(), hooks);
  EXPECT_TRUE(s.ok()) << s;
  return losses;
}

double MeanOfLast(const std::vector<double>& losses, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += losses[losses.size() - 1 - i];
  return sum / n;
}

// The goal for the CPU: emulated FP8 training of the tiny model stays
// within 2% of bf16 over 50 steps (here: the mean loss of the last 5 steps,
// and every step after warm-up).
TEST(Fp8RunTest, HybridTrainsWithinTwoPercentOfBf16) {
  const std::string root = ::testing::TempDir() + "/fp8_loss";
  const std::vector<double> bf16 = Train(TinyConfig(root + "/bf16", 50));
  ASSERT_LT(MeanOfLast(bf16, 5), 0.6 * bf16[1]) << "bf16 did not learn";
  for (const std::string recipe : {"delayed", "tensorwise"}) {
    SCOPED_TRACE(recipe);
    TrainConfig config = TinyConfig(root + "/" + recipe, 50);
    SetFp8(&config, recipe);
    const std::vector<double> fp8 = Train(config);
    const double b = MeanOfLast(bf16, 5), f = MeanOfLast(fp8, 5);
    std::printf(
        "%s: loss %.4f -> %.4f (bf16 %.4f -> %.4f), last-5 mean "
        "differs by %.2f%%\n",
        recipe.c_str(), fp8[1], fp8.back(), bf16[1], bf16.back(),
        100 * std::fabs(f - b) / b);
    EXPECT_NE(fp8, bf16) << "FP8 changed nothing";
    EXPECT_LE(std::fabs(f - b), 0.02 * b);
    for (size_t i = 10; i < fp8.size(); ++i) {
      EXPECT_LE(std::fabs(fp8[i] - bf16[i]), 0.05 * bf16[i]) << "step " << i;
    }
  }
}

// Checkpoints hold master weights, optimizer state and RNG only (no FP8
// state), so any run loads any other's.
TEST(Fp8RunTest, CheckpointsResumeAcrossFormats) {
  const std::string root = ::testing::TempDir() + "/fp8_resume";
  auto straight = [&](const std::string& name, bool fp8) {
    TrainConfig config = TinyConfig(root + "/" + name, 8);
    config.set_lr_decay_iters(8);
    if (fp8) SetFp8(&config, "tensorwise");
    return Train(config);
  };
  // First halves, saved at 4.
  auto first_half = [&](const std::string& name, bool fp8) {
    TrainConfig config = TinyConfig(root + "/" + name, 4);
    config.set_lr_decay_iters(8);  // The schedule of the 8-step runs.
    if (fp8) SetFp8(&config, "tensorwise");
    config.set_save(root + "/" + name + "/ckpt");
    config.set_save_interval(4);
    Train(config);
    return config.save();
  };
  auto second_half = [&](const std::string& name, const std::string& load,
                         bool fp8) {
    TrainConfig config = TinyConfig(root + "/" + name, 8);
    config.set_lr_decay_iters(8);
    if (fp8) SetFp8(&config, "tensorwise");
    config.set_load(load);
    return Train(config);
  };
  const std::vector<double> fp8_run = straight("fp8", true);
  const std::vector<double> bf16_run = straight("bf16", false);
  const std::string fp8_ckpt = first_half("fp8_first", true);
  const std::string bf16_ckpt = first_half("bf16_first", false);

  // FP8 from FP8: exactly the unbroken run (tensorwise keeps no state).
  const std::vector<double> fp8_fp8 = second_half("fp8_fp8", fp8_ckpt, true);
  for (int i = 5; i <= 8; ++i) {
    EXPECT_EQ(fp8_fp8[i], fp8_run[i]) << "step " << i;
    EXPECT_TRUE(std::isnan(fp8_fp8[i - 4])) << "resumed at 4";
  }
  // bf16 from FP8 and FP8 from bf16: they load, resume at 5, and continue
  // the loss of the run that saved within FP8's distance.
  const std::vector<double> bf16_fp8 =
      second_half("bf16_from_fp8", fp8_ckpt, false);
  const std::vector<double> fp8_bf16 =
      second_half("fp8_from_bf16", bf16_ckpt, true);
  for (int i = 5; i <= 8; ++i) {
    EXPECT_TRUE(std::isnan(bf16_fp8[i - 4]));
    EXPECT_NEAR(bf16_fp8[i], fp8_run[i], 0.02 * fp8_run[i]) << "step " << i;
    EXPECT_NEAR(fp8_bf16[i], bf16_run[i], 0.02 * bf16_run[i]) << "step " << i;
  }
  EXPECT_NE(bf16_fp8[5], fp8_run[5]) << "the bf16 resume ran FP8";
}

}  // namespace
}  // namespace training
}  // namespace mcc
