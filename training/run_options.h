#ifndef TRAINING_RUN_OPTIONS_H_
#define TRAINING_RUN_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/local_checkpoint.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "training/exit_conditions.h"
#include "training/microbatch_calculator.h"
#include "training/rerun_check.h"
#include "training/timeline_profile.h"
#include "training/train_config.pb.h"

// The options of each part of a training run, read from its TrainConfig and
// checked. Every error names the Megatron flag (the field of the same name)
// at fault, so a binary can print it as a flag error.

namespace mcc {
namespace training {

// Saving and resuming: save, save_interval, load, async_save, keep_last,
// no_load_rng, no_load_optim, continue_on_save_failure.
struct CheckpointOptions {
  std::string save;  // Directory to save into; empty: never save.
  int64_t save_interval = 0;
  std::string load;  // Directory to resume from; empty: start fresh.
  bool async_save = false;
  int keep_last = 0;  // 0 keeps every checkpoint.
  bool no_load_rng = false;
  bool no_load_optim = false;
  // --finetune: the weights only, from iteration 0 with a fresh optimizer.
  bool finetune = false;
  // After a failed save: log it and train on (true), or stop (false).
  bool continue_on_save_failure = false;

  // Whether to save after `iteration` (also true at the last iteration when
  // saving is on).
  bool ShouldSave(int64_t iteration, int64_t train_iters) const;
};
absl::StatusOr<CheckpointOptions> CheckpointOptionsFromConfig(
    const TrainConfig& config);

// Megatron's non-persistent (local) checkpoints: non_persistent_ckpt_type
// local, non_persistent_local_ckpt_dir, non_persistent_save_interval,
// replication, replication_jump, replication_factor (2 only).
struct LocalCheckpointSettings {
  bool enabled = false;  // non_persistent_ckpt_type local
  int64_t save_interval = 0;
  // dir, replicate and replication_jump set; the caller adds
  // ranks_per_node.
  LocalCheckpointOptions options;

  bool ShouldSave(int64_t iteration) const {
    return enabled && iteration % save_interval == 0;
  }
};
absl::StatusOr<LocalCheckpointSettings> LocalCheckpointSettingsFromConfig(
    const TrainConfig& config);

// The global batch and how many micro-batches make it on each DP rank.
struct Batching {
  int64_t global_batch = 0;
  int num_microbatches = 1;
};
// global_batch_size (0: micro_batch_size x dp) over `dp` data-parallel ranks.
absl::StatusOr<Batching> PlanBatches(const TrainConfig& config, int dp);

// Each step's global batch size and micro-batches: PlanBatches' global batch,
// ramped up by rampup_batch_size when set (errors name the flag).
absl::StatusOr<MicroBatchCalculator> MicroBatchCalculatorFromConfig(
    const TrainConfig& config, int dp);
// Every global batch size of the ramp still ahead after `consumed_samples`
// (all of it for a fresh run; the rest for a resumed or resharded one)
// divides by micro_batch_size x dp and gives a micro-batch count the
// pipeline schedule can run; a ramp is refused with
// pipeline_schedule_file, whose table is written for one count.
absl::Status CheckBatchRampAhead(const TrainConfig& config,
                                 const MicroBatchCalculator& batches,
                                 int64_t consumed_samples);

// The pipeline schedule of --pipeline-schedule, --pipeline-schedule-file
// (read and checked here, for `microbatches` per step) and
// --no-overlap-p2p-communication. Without pipelining (one stage) the
// executor's kNoPipelining and no table.
absl::StatusOr<pipeline::PipelineOptions> PipelineOptionsFromConfig(
    const TrainConfig& config, int microbatches);

// --use-precision-aware-optimizer's storage dtypes, refused (naming the
// flag) as Megatron refuses them: only with the distributed optimizer (or
// ZeRO-2/3) and Adam, --main-params-dtype fp16 only over 16-bit weights
// whose main copy the optimizer holds (not ZeRO-2/3's fp32 shards).
// --optimizer-cpu-offload (Megatron's name), refused on every device (see
// the message); --optimizer-offload-fraction only with it.
absl::Status CheckOptimizerOffload(const TrainConfig& config);
absl::StatusOr<optim::StatePrecision> StatePrecisionFromConfig(
    const TrainConfig& config);
absl::StatusOr<optim::OptimizerConfig> OptimizerConfigFromConfig(
    const TrainConfig& config);
absl::StatusOr<optim::LrSchedule> ScheduleFromConfig(const TrainConfig& config);

// exit_signal_handler, exit_duration_in_mins, exit_interval.
absl::StatusOr<ExitOptions> ExitOptionsFromConfig(const TrainConfig& config);

// The rerun check's options; nullopt with rerun_mode disabled.
absl::StatusOr<std::optional<RerunCheckOptions>> RerunCheckOptionsFromConfig(
    const TrainConfig& config);

// straggler_minmax_count and straggler_threshold.
absl::Status CheckStragglerOptions(const TrainConfig& config);

// profile and its window over `world_size` ranks.
absl::StatusOr<TimelineProfileConfig> TimelineProfileFromConfig(
    const TrainConfig& config, int world_size);

// expert_model_parallel_size, expert_tensor_parallel_size,
// moe_expert_capacity_factor and moe_token_drop_policy for a model with
// `num_experts` experts per MoE layer (0: no MoE layers; the GPT model has
// none until --num-experts reaches it) over `world_size` ranks. Refuses,
// naming the flag: EP or capacity without MoE layers, experts that do not
// divide over EP, an expert layout (ETP x EP x PP) that does not divide the
// world, an unknown drop policy.
absl::Status CheckExpertParallelOptions(const TrainConfig& config,
                                        int64_t num_experts, int world_size);

// What the GPT runs of an expert layout (--expert-model-parallel-size or
// --expert-tensor-parallel-size > 1 with --num-experts): refused by name
// beside TP (needs SP, not built with MoE), with ZeRO-2/3, with HSDP
// instances, and ETP > 1 with --save / --load.
absl::Status CheckExpertLayout(const TrainConfig& config);

// Every check of the config that needs no process group, for a world of
// `world_size` processes (the tokenizer files and data paths included).
absl::Status CheckTrainConfig(const TrainConfig& config, int world_size);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_RUN_OPTIONS_H_
