// --use-precision-aware-optimizer and checkpoints: Adam's moments saved in
// bf16 load into an fp32 run exactly (widening), and fp32 ones load into a
// bf16 run rounded to nearest.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "training/run.h"
#include "training/run_options.h"
#include "training/testing/tiny_run.h"

namespace mcc {
namespace training {
namespace {

TrainConfig TinyConfig(const std::string& dir, bool bf16_moments,
                       const std::string& strategy = "") {
  std::filesystem::remove_all(dir);
  TrainConfig config = testing::TinyRunConfig(dir);
  config.set_train_iters(3);
  config.set_eval_interval(100);
  config.set_save_interval(3);
  config.set_save(dir + "/ckpt");
  if (strategy.empty()) {
    config.set_use_distributed_optimizer(true);
  } else {
    config.set_data_parallel_sharding_strategy(strategy);
  }
  if (bf16_moments) {
    config.set_use_precision_aware_optimizer(true);
    config.set_exp_avg_dtype("bf16");
    config.set_exp_avg_sq_dtype("bf16");
  }
  return config;
}

using States = std::map<std::string, Tensor>;  // name -> host copy.

States Moments(const Trainer& trainer) {
  States out;
  for (auto& s : trainer.parts().optimizer->StateTensors()) {
    if (s.state == "main_param") continue;
    out[s.name] = s.tensor.Clone();
  }
  return out;
}

// Trains `config` and returns its optimizer's moments after the last step.
States TrainAndKeepMoments(const TrainConfig& config) {
  States moments;
  const Trainer* trainer = nullptr;
  RunHooks hooks;
  hooks.after_setup = [&](Job&, Trainer& t, int64_t) {
    trainer = &t;
    return absl::OkStatus();
  };
  hooks.after_save = [&](int64_t, const std::string&) {
    moments = Moments(*trainer);
    return absl::OkStatus();
  };
  auto exit = ExitConditions::Create(*ExitOptionsFromConfig(config),
                                     absl::Now(), nullptr);
  EXPECT_TRUE(exit.ok());
  absl::Status s = Run(config, exit->get(), hooks);
  EXPECT_TRUE(s.ok()) << s;
  return moments;
}

// Loads `load` into `config` and returns the moments right after loading.
States LoadedMoments(TrainConfig config, const std::string& load) {
  config.set_load(load);
  config.set_save_interval(0);
  config.set_save("");
  config.set_train_iters(4);
  States moments;
  RunHooks hooks;
  hooks.after_setup = [&](Job&, Trainer& t, int64_t first) {
    EXPECT_EQ(first, 4);  // Resumed after the saved iteration.
    moments = Moments(t);
    return absl::OkStatus();
  };
  auto exit = ExitConditions::Create(*ExitOptionsFromConfig(config),
                                     absl::Now(), nullptr);
  EXPECT_TRUE(exit.ok());
  absl::Status s = Run(config, exit->get(), hooks);
  EXPECT_TRUE(s.ok()) << s;
  return moments;
}

TEST(StatePrecisionCheckpointTest, Bf16MomentsLoadIntoFp32Exactly) {
  const std::string dir = ::testing::TempDir() + "/bf16_to_fp32";
  const TrainConfig saving = TinyConfig(dir, /*bf16_moments=*/true);
  const States saved = TrainAndKeepMoments(saving);
  ASSERT_FALSE(saved.empty());
  const States loaded =
      LoadedMoments(TinyConfig(dir + "/load", false), saving.save());
  ASSERT_EQ(loaded.size(), saved.size());
  for (const auto& [name, t] : saved) {
    ASSERT_EQ(t.dtype(), DType::kBFloat16) << name;
    const Tensor& l = loaded.at(name);
    ASSERT_EQ(l.dtype(), DType::kFloat32) << name;
    EXPECT_EQ(l.ToDoubles(), t.ToDoubles()) << name;
  }
}

// ZeRO-3: the moments beside the wrapper's fp32 main shards.
TEST(StatePrecisionCheckpointTest, Bf16MomentsUnderZero3LoadIntoFp32) {
  const std::string dir = ::testing::TempDir() + "/zero3_bf16_to_fp32";
  const TrainConfig saving = TinyConfig(dir, true, "optim_grads_params");
  const States saved = TrainAndKeepMoments(saving);
  ASSERT_FALSE(saved.empty());
  const States loaded = LoadedMoments(
      TinyConfig(dir + "/load", false, "optim_grads_params"), saving.save());
  ASSERT_EQ(loaded.size(), saved.size());
  for (const auto& [name, t] : saved) {
    ASSERT_EQ(t.dtype(), DType::kBFloat16) << name;
    EXPECT_EQ(loaded.at(name).ToDoubles(), t.ToDoubles()) << name;
  }
}

TEST(StatePrecisionCheckpointTest, Fp32MomentsLoadIntoBf16RoundedToNearest) {
  const std::string dir = ::testing::TempDir() + "/fp32_to_bf16";
  const TrainConfig saving = TinyConfig(dir, /*bf16_moments=*/false);
  const States saved = TrainAndKeepMoments(saving);
  ASSERT_FALSE(saved.empty());
  const States loaded =
      LoadedMoments(TinyConfig(dir + "/load", true), saving.save());
  ASSERT_EQ(loaded.size(), saved.size());
  int inexact = 0;
  for (const auto& [name, t] : saved) {
    const Tensor& l = loaded.at(name);
    ASSERT_EQ(l.dtype(), DType::kBFloat16) << name;
    EXPECT_EQ(l.ToDoubles(), t.To(DType::kBFloat16)->ToDoubles()) << name;
    if (l.ToDoubles() != t.ToDoubles()) ++inexact;
  }
  EXPECT_GT(inexact, 0);  // The load really rounded.
}

}  // namespace
}  // namespace training
}  // namespace mcc
