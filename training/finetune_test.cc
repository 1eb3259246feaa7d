// --finetune (Megatron's): the weights from --load, with the iteration, the
// consumed samples and the optimizer state starting afresh.
#include <filesystem>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "checkpoint/checkpoint_reader.h"
#include "gtest/gtest.h"
#include "training/run.h"
#include "training/run_options.h"
#include "training/testing/tiny_run.h"

namespace mcc {
namespace training {
namespace {

TrainConfig TinyConfig(const std::string& dir) {
  return testing::TinyRunConfig(dir);
}

absl::Status RunIt(const TrainConfig& config, RunHooks hooks = {}) {
  return testing::RunTiny(config, hooks);
}

// The optimizer's step count and the progress a checkpoint records.
struct Saved {
  int64_t iteration = -1, consumed = -1, optimizer_step = -1;
};
Saved ReadSaved(const std::string& dir) {
  Saved s;
  auto r = CheckpointReader::Open(dir);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return s;
  s.iteration = (*r)->common_state().iteration();
  s.consumed = (*r)->common_state().consumed_train_samples();
  auto step = (*r)->common_state().extra().find("optimizer_step");
  if (step != (*r)->common_state().extra().end()) {
    s.optimizer_step = std::stoll(step->second);
  }
  return s;
}

TEST(FinetuneTest, LoadsWeightsAndRestartsIterationAndOptimizer) {
  const std::string dir = ::testing::TempDir() + "/finetune";
  std::filesystem::remove_all(dir);
  TrainConfig pretrain = TinyConfig(dir);
  pretrain.set_save(dir + "/pretrained");
  ASSERT_TRUE(RunIt(pretrain).ok());
  const Saved before = ReadSaved(dir + "/pretrained");
  EXPECT_EQ(before.iteration, 6);
  EXPECT_EQ(before.optimizer_step, 6);

  // A plain resume carries both on.
  TrainConfig resume = TinyConfig(dir);
  resume.set_load(dir + "/pretrained");
  resume.set_save(dir + "/resumed");
  resume.set_train_iters(8);
  ASSERT_TRUE(RunIt(resume).ok());
  const Saved resumed = ReadSaved(dir + "/resumed");
  EXPECT_EQ(resumed.iteration, 8);
  EXPECT_EQ(resumed.optimizer_step, 8);

  TrainConfig finetune = resume;
  finetune.set_save(dir + "/finetuned");
  finetune.set_finetune(true);
  finetune.set_train_iters(2);
  int64_t first = -1;
  RunHooks hooks;
  hooks.after_setup = [&](Job&, Trainer&, int64_t first_iteration) {
    first = first_iteration;
    return absl::OkStatus();
  };
  ASSERT_TRUE(RunIt(finetune, hooks).ok());
  EXPECT_EQ(first, 1);
  const Saved tuned = ReadSaved(dir + "/finetuned");
  EXPECT_EQ(tuned.iteration, 2);
  EXPECT_EQ(tuned.consumed, 2 * 4);
  EXPECT_EQ(tuned.optimizer_step, 2);

  // The weights did come from --load: a fresh start ends elsewhere.
  TrainConfig fresh = TinyConfig(dir);
  fresh.set_save(dir + "/fresh");
  fresh.set_train_iters(2);
  ASSERT_TRUE(RunIt(fresh).ok());
  auto a = CheckpointReader::Open(dir + "/finetuned");
  auto b = CheckpointReader::Open(dir + "/fresh");
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string name = "decoder.final_layernorm.weight";
  auto wa = (*a)->ReadTensor(name);
  auto wb = (*b)->ReadTensor(name);
  ASSERT_TRUE(wa.ok() && wb.ok());
  EXPECT_NE(wa->ToDoubles(), wb->ToDoubles());
}

}  // namespace
}  // namespace training
}  // namespace mcc
