#include "training/run_options.h"

#include <string>

#include "gtest/gtest.h"
#include "training/device_choice.h"

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

TEST(OptimizerOffloadTest, CheckedAndPassedToTheOptimizer) {
  TrainConfig config;
  EXPECT_TRUE(CheckOptimizerOffload(config).ok());
  EXPECT_EQ(OptimizerConfigFromConfig(config)->cpu_offload_fraction, 0.0);
  config.set_optimizer_cpu_offload(true);
  config.set_device("cpu");
  absl::Status s = CheckOptimizerOffload(config);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--optimizer-cpu-offload"), std::string::npos);
  EXPECT_NE(s.message().find("meaningless"), std::string::npos);
  // On a machine without a GPU --device auto is the CPU: refused alike;
  // cuda is refused there by --device's own check, not by this one.
  config.set_device("auto");
  EXPECT_EQ(CheckOptimizerOffload(config).ok(),
            !ChooseDevice("auto")->device.is_cpu());
  config.set_device("cuda");
  EXPECT_TRUE(CheckOptimizerOffload(config).ok());
  // Megatron's default fraction: all of it.
  EXPECT_EQ(OptimizerConfigFromConfig(config)->cpu_offload_fraction, 1.0);
  config.set_optimizer_offload_fraction(0.25);
  EXPECT_EQ(OptimizerConfigFromConfig(config)->cpu_offload_fraction, 0.25);
  for (double bad : {0.0, -1.0, 1.5}) {
    config.set_optimizer_offload_fraction(bad);
    s = CheckOptimizerOffload(config);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--optimizer-offload-fraction"),
              std::string::npos);
  }
  config.set_optimizer_cpu_offload(false);
  config.set_optimizer_offload_fraction(0.5);
  s = CheckOptimizerOffload(config);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--optimizer-offload-fraction"),
            std::string::npos);
}

TEST(StatePrecisionFromConfigTest, RefusesWhatMegatronRefuses) {
  TrainConfig config;
  config.set_exp_avg_dtype("bf16");
  // The dtypes only with the switch.
  EXPECT_NE(StatePrecisionFromConfig(config).status().message().find(
                "--use-precision-aware-optimizer"),
            std::string::npos);
  config.set_use_precision_aware_optimizer(true);
  // Only with the distributed optimizer.
  EXPECT_NE(StatePrecisionFromConfig(config).status().message().find(
                "distributed optimizer"),
            std::string::npos);
  config.set_use_distributed_optimizer(true);
  auto p = StatePrecisionFromConfig(config);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->exp_avg, DType::kBFloat16);
  EXPECT_EQ(p->exp_avg_sq, DType::kFloat32);
  // fp16 main params only over 16-bit weights.
  config.set_main_params_dtype("fp16");
  EXPECT_NE(StatePrecisionFromConfig(config).status().message().find(
                "--main-params-dtype fp16"),
            std::string::npos);
  config.set_bf16(true);
  EXPECT_TRUE(StatePrecisionFromConfig(config).ok());
  // Megatron has no bf16 main params.
  config.set_main_params_dtype("bf16");
  EXPECT_FALSE(StatePrecisionFromConfig(config).ok());
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

// --rampup-batch-size: read from the config; every size ahead must divide
// and suit the pipeline schedule; a schedule file's fixed count refuses it.
TEST(BatchRampTest, EverySizeAheadIsChecked) {
  TrainConfig config;
  config.set_micro_batch_size(1);
  config.set_global_batch_size(8);
  config.set_rampup_batch_size("2 2 12");
  auto c = MicroBatchCalculatorFromConfig(config, 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->GlobalBatchSize(4), 4);
  EXPECT_EQ(c->NumMicroBatches(4), 2);
  EXPECT_TRUE(CheckBatchRampAhead(config, *c, 0).ok());
  // Interleaved over 2 stages needs an even count: 2, 4, 6, 8 micro-batches
  // at DP 1 pass; at DP 2 the start's single micro-batch does not, but a
  // run resumed past it does.
  config.set_num_layers(4);
  config.set_pipeline_model_parallel_size(2);
  config.set_num_layers_per_virtual_pipeline_stage(1);
  auto dp1 = MicroBatchCalculatorFromConfig(config, 1);
  ASSERT_TRUE(dp1.ok());
  EXPECT_TRUE(CheckBatchRampAhead(config, *dp1, 0).ok());
  absl::Status s = CheckBatchRampAhead(config, *c, 0);
  EXPECT_NE(s.message().find("--rampup-batch-size: at the ramp's global "
                             "batch size 2: the interleaved schedule"),
            std::string::npos)
      << s;
  EXPECT_NE(CheckBatchRampAhead(config, *c, 4).message().find("size 6"),
            std::string::npos);
  EXPECT_TRUE(CheckBatchRampAhead(config, *c, 13).ok());
  config.set_pipeline_schedule_file("/tmp/schedule.csv");
  EXPECT_NE(CheckBatchRampAhead(config, *dp1, 0)
                .message()
                .find("--rampup-batch-size cannot be combined with "
                      "--pipeline-schedule-file"),
            std::string::npos);
  config.set_rampup_batch_size("2 2");
  EXPECT_NE(MicroBatchCalculatorFromConfig(config, 1).status().message().find(
                "--rampup-batch-size '2 2'"),
            std::string::npos);
}

// The experts' flags: accepted as defaults and where MoE layers exist,
// refused by name otherwise.
// The first/last stage split with virtual stages: ZB-V halves each
// stage's layers over its chunks; the interleaved schedule refuses it.
TEST(PipelineOptionsTest, UnevenSplitWithVirtualStages) {
  TrainConfig config;
  config.set_num_layers(6);
  config.set_pipeline_model_parallel_size(2);
  config.set_decoder_first_pipeline_num_layers(2);
  config.set_pipeline_schedule("zbv");
  auto zbv = PipelineOptionsFromConfig(config, 8);
  ASSERT_TRUE(zbv.ok()) << zbv.status();
  EXPECT_EQ(zbv->schedule, pipeline::ScheduleKind::kZeroBubbleV);
  config.set_decoder_first_pipeline_num_layers(1);
  EXPECT_NE(PipelineOptionsFromConfig(config, 8).status().message().find(
                "each stage needs an even count"),
            std::string::npos);
  config.set_decoder_first_pipeline_num_layers(2);
  config.set_pipeline_schedule("interleaved");
  config.set_num_layers_per_virtual_pipeline_stage(1);
  EXPECT_NE(PipelineOptionsFromConfig(config, 8).status().message().find(
                "(the interleaved schedule) cannot be combined"),
            std::string::npos);
}

TEST(ExpertParallelOptionsTest, RefusalsNameTheFlag) {
  auto message = [](const TrainConfig& c, int64_t experts, int world) {
    return std::string(CheckExpertParallelOptions(c, experts, world).message());
  };
  TrainConfig config;
  EXPECT_TRUE(CheckExpertParallelOptions(config, 0, 8).ok());
  EXPECT_TRUE(CheckExpertParallelOptions(config, 8, 8).ok());
  config.set_expert_model_parallel_size(4);
  EXPECT_NE(message(config, 0, 8)
                .find("--expert-model-parallel-size 4 needs "
                      "MoE layers (--num-experts)"),
            std::string::npos);
  EXPECT_TRUE(CheckExpertParallelOptions(config, 8, 8).ok());
  EXPECT_NE(message(config, 6, 8)
                .find("--num-experts 6 is not a multiple of "
                      "--expert-model-parallel-size 4"),
            std::string::npos);
  // World 6 does not divide over EP 4 (x ETP 1 x PP 1).
  EXPECT_NE(
      message(config, 8, 6)
          .find("--expert-tensor-parallel-size (1, from "
                "--tensor-model-parallel-size) x "
                "--expert-model-parallel-size (4) x "
                "--pipeline-model-parallel-size (1) = 4 does not divide the "
                "world size 6"),
      std::string::npos);
  // ETP defaults to TP's size.
  config.set_expert_model_parallel_size(1);
  config.set_tensor_model_parallel_size(4);
  EXPECT_NE(
      message(config, 8, 6).find("(4, from --tensor-model-parallel-size)"),
      std::string::npos);
  EXPECT_TRUE(CheckExpertParallelOptions(config, 8, 8).ok());
  config.set_expert_tensor_parallel_size(2);
  config.set_expert_model_parallel_size(2);
  EXPECT_TRUE(CheckExpertParallelOptions(config, 8, 8).ok());
  config.set_expert_tensor_parallel_size(-1);
  EXPECT_NE(message(config, 8, 8).find("--expert-tensor-parallel-size -1"),
            std::string::npos);
  config = TrainConfig();
  config.set_moe_expert_capacity_factor(1.25);
  EXPECT_NE(message(config, 0, 1)
                .find("--moe-expert-capacity-factor 1.25 "
                      "needs MoE layers"),
            std::string::npos);
  EXPECT_TRUE(CheckExpertParallelOptions(config, 8, 1).ok());
  config.set_moe_token_drop_policy("random");
  EXPECT_NE(message(config, 8, 1).find("--moe-token-drop-policy 'random'"),
            std::string::npos);
  // The training run checks them (no MoE layers yet).
  config = TrainConfig();
  config.set_expert_model_parallel_size(2);
  EXPECT_NE(std::string(CheckTrainConfig(config, 2).message())
                .find("--expert-model-parallel-size 2 needs MoE layers"),
            std::string::npos);
}

// What the GPT runs of an expert layout, and what it refuses by name.
TEST(ExpertLayoutTest, AcceptsTp1OrSpAndRefusesWhatIsNotBuilt) {
  TrainConfig config;
  config.set_num_experts(8);
  EXPECT_TRUE(CheckExpertLayout(config).ok());
  config.set_expert_model_parallel_size(2);
  EXPECT_TRUE(CheckExpertLayout(config).ok());
  config.set_use_distributed_optimizer(true);
  config.set_save("/tmp/ckpt");
  EXPECT_TRUE(CheckExpertLayout(config).ok());  // EP checkpoints reshard.
  auto message = [](const TrainConfig& c) {
    return std::string(CheckExpertLayout(c).message());
  };
  TrainConfig tp = config;
  tp.set_tensor_model_parallel_size(2);
  EXPECT_NE(message(tp).find("needs --sequence-parallel"), std::string::npos)
      << message(tp);
  // Under SP each TP rank routes its own tokens: EP beside TP runs, and ETP
  // 0 is TP's there.
  TrainConfig tp_sp = tp;
  tp_sp.set_sequence_parallel(true);
  tp_sp.set_expert_tensor_parallel_size(1);
  EXPECT_TRUE(CheckExpertLayout(tp_sp).ok()) << CheckExpertLayout(tp_sp);
  tp_sp.set_expert_tensor_parallel_size(0);
  EXPECT_TRUE(CheckExpertLayout(tp_sp).ok()) << CheckExpertLayout(tp_sp);
  tp_sp.set_expert_model_parallel_size(1);  // ETP 2 = TP alone.
  EXPECT_TRUE(CheckExpertLayout(tp_sp).ok());
  // ZeRO-2/3 shard the expert weights over the expert-data group.
  for (const char* zero : {"optim_grads", "optim_grads_params"}) {
    TrainConfig sharded = config;
    sharded.set_use_distributed_optimizer(false);
    sharded.set_data_parallel_sharding_strategy(zero);
    EXPECT_TRUE(CheckExpertLayout(sharded).ok())
        << zero << ": " << message(sharded);
  }
  TrainConfig hsdp = config;
  hsdp.set_num_distributed_optimizer_instances(2);
  EXPECT_TRUE(CheckExpertLayout(hsdp).ok()) << message(hsdp);
  TrainConfig etp = config;
  etp.set_expert_model_parallel_size(1);
  etp.set_expert_tensor_parallel_size(2);
  EXPECT_TRUE(CheckExpertLayout(etp).ok());  // ETP checkpoints reshard too.
  etp.set_load("/tmp/ckpt");
  EXPECT_TRUE(CheckExpertLayout(etp).ok());
  // Without MoE layers there is nothing to lay out here.
  TrainConfig dense = tp;
  dense.set_num_experts(0);
  EXPECT_TRUE(CheckExpertLayout(dense).ok());
}

}  // namespace
}  // namespace training
}  // namespace mcc
