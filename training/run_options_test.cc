#include "training/run_options.h"

#include <string>

#include "gtest/gtest.h"

namespace mcc {
namespace training {
namespace {

TEST(CheckpointOptionsTest, ReadsAndChecks) {
  TrainConfig config;
  config.set_save("/tmp/run");
  config.set_save_interval(100);
  config.set_keep_last(3);
  auto f = CheckpointOptionsFromConfig(config);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->save, "/tmp/run");
  EXPECT_EQ(f->keep_last, 3);
  EXPECT_TRUE(f->ShouldSave(200, 1000));
  EXPECT_FALSE(f->ShouldSave(150, 1000));
  EXPECT_TRUE(f->ShouldSave(1000, 1000));

  config.clear_save();
  f = CheckpointOptionsFromConfig(config);
  EXPECT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("--save-interval"), std::string::npos);
  config.set_save_interval(0);
  f = CheckpointOptionsFromConfig(config);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->ShouldSave(1000, 1000));
}

// The proto's defaults are the flags' (tools/flags_test checks each against
// its flag); these are the ones a library caller most relies on.
TEST(TrainConfigTest, DefaultsAreMegatronsFlags) {
  const TrainConfig config;
  EXPECT_EQ(config.train_iters(), 300);
  EXPECT_EQ(config.micro_batch_size(), 8);
  EXPECT_DOUBLE_EQ(config.lr(), 1e-3);
  EXPECT_EQ(config.optimizer(), "adam");
  EXPECT_EQ(config.tensor_model_parallel_size(), 1);
  EXPECT_TRUE(config.check_for_nan_in_loss_and_grad());
  EXPECT_FALSE(config.has_lr());  // Defaults carry no presence.
}

TEST(PlanBatchesTest, GlobalBatchMustDivide) {
  TrainConfig config;
  config.set_micro_batch_size(2);
  config.set_global_batch_size(12);
  auto b = PlanBatches(config, 3);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->num_microbatches, 2);
  config.set_global_batch_size(10);
  b = PlanBatches(config, 3);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("--global-batch-size"),
            std::string::npos);
}

}  // namespace
}  // namespace training
}  // namespace mcc
