#include "training/checkpoint_eval.h"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "training/run.h"
#include "training/run_options.h"
#include "training/testing/tiny_run.h"

namespace mcc {
namespace training {
namespace {

// A tiny run on mock data, one process, saved at its last step, which is
// also its last validation.
TrainConfig TinyTrainConfig(const std::string& dir) {
  TrainConfig config = testing::TinyRunConfig(dir);
  config.set_global_batch_size(2);
  config.set_train_iters(4);
  config.set_eval_interval(4);
  config.set_eval_iters(2);
  config.set_save_interval(4);
  config.set_save(dir + "/ckpt");
  return config;
}

// Trains once per test binary; the validation loss train reported at its
// last step.
class CheckpointEvalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::string(std::getenv("TEST_TMPDIR")) + "/run");
    const TrainConfig config = TinyTrainConfig(*dir_);
    RunHooks hooks;
    hooks.after_evaluation = [](int64_t iteration, double loss) {
      if (iteration == 4) train_validation_loss_ = loss;
      return absl::OkStatus();
    };
    const absl::Status s = testing::RunTiny(config, hooks);
    ASSERT_TRUE(s.ok()) << s;
  }

  // An evaluation of the saved checkpoint on the same mock data; only the
  // settings a user of eval would give.
  static EvalConfig BaseConfig() {
    EvalConfig config;
    TrainConfig* run = config.mutable_run();
    run->set_load(*dir_ + "/ckpt");
    run->set_mock_data(true);
    run->set_micro_batch_size(2);
    run->set_eval_iters(2);
    run->set_num_threads(1);
    run->set_device("cpu");
    return config;
  }

  static std::string* dir_;
  static std::optional<double> train_validation_loss_;
};

std::string* CheckpointEvalTest::dir_ = nullptr;
std::optional<double> CheckpointEvalTest::train_validation_loss_;

TEST_F(CheckpointEvalTest, ValidationLossIsTheOneTrainingReported) {
  ASSERT_TRUE(train_validation_loss_.has_value());
  auto plan = PlanCheckpointEval(BaseConfig(), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->evaluate);
  EXPECT_FALSE(plan->generate);
  EXPECT_EQ(plan->model.num_layers, 2);  // From the checkpoint.
  auto result = EvaluateCheckpoint(*plan);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->reported);
  ASSERT_EQ(result->splits.size(), 2u);
  EXPECT_EQ(result->splits[0].split, "validation");
  EXPECT_FALSE(result->splits[0].empty);
  // The same weights on the same micro-batches in the same order.
  EXPECT_EQ(result->splits[0].loss, *train_validation_loss_);
  EXPECT_EQ(result->splits[1].split, "test");
  EXPECT_GT(result->splits[1].loss, 0);
  EXPECT_FALSE(result->generation.has_value());
}

TEST_F(CheckpointEvalTest, GivenModelFieldsMustAgreeWithTheCheckpoint) {
  EvalConfig config = BaseConfig();
  config.mutable_run()->set_num_layers(2);  // Agrees: accepted.
  ASSERT_TRUE(PlanCheckpointEval(config, 1).ok());
  config.mutable_run()->set_num_layers(3);
  config.mutable_run()->set_hidden_size(32);
  const auto plan = PlanCheckpointEval(config, 1);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find(
                "--num-layers 3 disagrees with the checkpoint's num_layers 2"),
            std::string::npos)
      << plan.status();
  EXPECT_NE(plan.status().message().find(
                "--hidden-size 32 disagrees with the checkpoint's hidden_size "
                "16"),
            std::string::npos)
      << plan.status();
}

TEST_F(CheckpointEvalTest, GreedyGenerationIsTheSameWithAndWithoutKvCache) {
  EvalConfig config = BaseConfig();
  config.mutable_run()->clear_eval_iters();  // With a prompt: no evaluation.
  config.set_prompt_ids("1 5 9 3");
  config.set_output_ids(true);
  config.set_temperature(0);
  config.set_max_new_tokens(6);
  auto plan = PlanCheckpointEval(config, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->evaluate);
  EXPECT_EQ(plan->tokenizer, nullptr);  // Ids in and out: no tokenizer read.
  auto cached = EvaluateCheckpoint(*plan);
  ASSERT_TRUE(cached.ok()) << cached.status();
  ASSERT_TRUE(cached->generation.has_value());
  EXPECT_EQ(cached->generation->tokens.size(), 6u);
  EXPECT_EQ(cached->generation->prompt_tokens, 4);
  ASSERT_TRUE(cached->generation->prompt_loss.has_value());
  EXPECT_EQ(cached->generation->prompt_loss_predictions, 3);

  config.set_no_kv_cache(true);
  auto recomputed_plan = PlanCheckpointEval(config, 1);
  ASSERT_TRUE(recomputed_plan.ok()) << recomputed_plan.status();
  auto recomputed = EvaluateCheckpoint(*recomputed_plan);
  ASSERT_TRUE(recomputed.ok()) << recomputed.status();
  EXPECT_EQ(recomputed->generation->tokens, cached->generation->tokens);
}

TEST_F(CheckpointEvalTest, BadSettingsAreNamed) {
  EvalConfig config = BaseConfig();
  config.set_prompt_ids("1 99999");
  config.set_output_ids(true);
  auto plan = PlanCheckpointEval(config, 1);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("--prompt-ids: '99999'"),
            std::string::npos)
      << plan.status();

  config = BaseConfig();
  config.mutable_run()->set_load(*dir_ + "/missing");
  plan = PlanCheckpointEval(config, 1);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("--load"), std::string::npos)
      << plan.status();

  config = BaseConfig();
  config.mutable_run()->set_tensor_model_parallel_size(2);
  EXPECT_FALSE(PlanCheckpointEval(config, 1).ok());  // A world of one.
}

}  // namespace
}  // namespace training
}  // namespace mcc
