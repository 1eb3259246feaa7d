// tools/train: trains a GPT with Megatron-LM's flags. With no flags it runs
// the default: a small GPT on the embedded English corpus, a few hundred
// steps, then saves, evaluates and says how to generate from the result.
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/flags.h"
#include "core/allocator.h"
#include "core/comm/flight_recorder.h"
#include "core/op_profile.h"
#include "core/ops/gemm.h"
#include "core/status_macros.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "glog/logging.h"
#include "models/gpt/graphed_stage.h"
#include "observability/tensorboard_writer.h"
#include "observability/trace.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/grad_consistency.h"
#include "parallel/data_parallel/replica_groups.h"
#include "parallel/data_parallel/weight_hash.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/pipeline/layer_split.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "tools/comm_dist_context.h"
#include "tools/device_choice.h"
#include "tools/dry_run.h"
#include "tools/flags/device_flag.h"
#include "tools/flags/megatron_args.h"
#include "tools/flags/presets.h"
#include "tools/flags/train_config.pb.h"
#include "tools/flags/training_flags.h"
#include "tools/job.h"
#include "tools/timeline_profile.h"
#include "tools/training_checkpoint.h"
#include "tools/training_metrics.h"
#include "training/exit_conditions.h"
#include "training/rerun_check.h"
#include "training/straggler_detector.h"
#include "training/trainer.h"

// Defined with the process groups (core/comm).
ABSL_DECLARE_FLAG(bool, debug_collectives);

ABSL_FLAG(std::string, config, "",
          "Text-format TrainConfig protobuf; flags given override it.");
ABSL_FLAG(std::string, preset, "",
          "Named settings for unset flags: 'bench' (6 layers, hidden 512, 8 "
          "heads, vocabulary 8192, sequence 512, micro-batch 4, mock data).");
ABSL_FLAG(int32_t, global_batch_size, 0,
          "Samples per step over all DP ranks (0: micro-batch x DP).");
ABSL_FLAG(int64_t, train_iters, 300, "Training iterations.");
ABSL_FLAG(int32_t, eval_iters, 10, "Micro-batches per evaluation.");
ABSL_FLAG(int32_t, eval_interval, 100, "Iterations between evaluations.");
ABSL_FLAG(std::string, optimizer, "adam", "adam (AdamW) or sgd.");
ABSL_FLAG(double, lr, 1e-3, "Peak learning rate.");
ABSL_FLAG(double, min_lr, 1e-4, "Learning rate at the end of the decay.");
ABSL_FLAG(int64_t, lr_warmup_iters, 0, "Linear warmup iterations.");
ABSL_FLAG(double, lr_warmup_fraction, -1.0,
          "Warmup as a fraction of --lr-decay-iters (overrides iters).");
ABSL_FLAG(int64_t, lr_decay_iters, 0, "Decay iterations (0: --train-iters).");
ABSL_FLAG(std::string, lr_decay_style, "cosine",
          "constant, linear, cosine or inverse-square-root.");
ABSL_FLAG(double, weight_decay, 0.01, "Decoupled weight decay.");
ABSL_FLAG(double, adam_beta1, 0.9, "Adam beta1.");
ABSL_FLAG(double, adam_beta2, 0.95, "Adam beta2.");
ABSL_FLAG(double, adam_eps, 1e-8, "Adam epsilon.");
ABSL_FLAG(double, sgd_momentum, 0.9, "SGD momentum.");
ABSL_FLAG(double, clip_grad, 1.0, "Global gradient-norm clip (0: none).");
ABSL_FLAG(double, loss_scale, 0.0, "Static fp16 loss scale (0: dynamic).");
ABSL_FLAG(double, initial_loss_scale, 4294967296.0, "Initial dynamic scale.");
ABSL_FLAG(double, min_loss_scale, 1.0, "Minimum dynamic scale.");
ABSL_FLAG(int32_t, loss_scale_window, 1000, "Clean steps before growing.");
ABSL_FLAG(int32_t, hysteresis, 2, "Overflows tolerated before backing off.");
ABSL_FLAG(bool, accumulate_allreduce_grads_in_fp32, true,
          "Gradients accumulate and reduce in fp32, as they always do here; "
          "--no-accumulate-allreduce-grads-in-fp32 is refused.");
ABSL_FLAG(bool, check_for_nan_in_loss_and_grad, true,
          "Stop with an error naming the iteration, rank and first "
          "non-finite tensor when the loss, or (without loss scaling, which "
          "skips such steps by design) a gradient, is inf or NaN. False: "
          "log it, skip the step's update and train on.");
ABSL_FLAG(bool, use_distributed_optimizer, false,
          "Shard fp32 main parameters and optimizer state over DP (ZeRO-1).");
ABSL_FLAG(std::string, data_parallel_sharding_strategy, "no_shard",
          "no_shard, optim (as --use-distributed-optimizer), optim_grads "
          "(also gradients: ZeRO-2) or optim_grads_params (also parameters, "
          "gathered per layer: ZeRO-3), as Megatron's FSDP.");
ABSL_FLAG(bool, overlap_grad_reduce, false,
          "Reduce gradient buckets during backward.");
ABSL_FLAG(int64_t, ddp_bucket_size, 40000000,
          "Gradient bucket size in elements.");
ABSL_FLAG(bool, overlap_param_gather, false,
          "Gather updated parameters during the next forward.");
ABSL_FLAG(int32_t, check_weight_hash_across_dp_replicas_interval, 0,
          "Compare parameter hashes across their replicas every N steps: DP "
          "replicas, TP-replicated parameters (norms, row-parallel biases), "
          "the tied embedding's first- and last-stage copies, CP replicas.");
ABSL_FLAG(int32_t, check_grad_consistency_interval, 0,
          "Every N steps, before the optimizer step, compare each replicated "
          "parameter's reduced gradient across its replicas (DP where "
          "gradients are whole, TP, the tied embedding's stages, CP) and stop "
          "naming the first tensor, rank pair and difference that disagree.");
ABSL_FLAG(bool, log_num_zeros_in_grad, false,
          "Log the number of zero gradient elements (num zeros).");
ABSL_FLAG(bool, log_params_norm, false,
          "Log the L2 norm of the parameters (params norm).");
ABSL_FLAG(int32_t, log_interval, 10, "Iterations between log lines.");
ABSL_FLAG(int32_t, timing_log_level, 0,
          "0: none; 1: forward-backward, grad sync, optimizer, data times; "
          "2: also the time per op (GEMM, attention, norms, ...) and outside "
          "ops, per iteration.");
ABSL_FLAG(std::string, metrics_file, "",
          "Append one JSON line per logged iteration.");
ABSL_FLAG(double, peak_tflops, 0.0,
          "Peak TFLOP/s for MFU (0: measure the GEMM peak at start).");
ABSL_FLAG(std::string, tensorboard_dir, "",
          "Write TensorBoard event files here (rank 0): loss, learning rate, "
          "grad norm, loss scale, throughput, MFU, validation loss and "
          "perplexity, under Megatron's tag names.");
ABSL_FLAG(int32_t, tensorboard_log_interval, 1,
          "Iterations between TensorBoard scalars.");
ABSL_FLAG(bool, log_timers_to_tensorboard, false,
          "Also write the step's timers (forward-backward, grad sync, "
          "optimizer, data) to TensorBoard.");
ABSL_FLAG(bool, log_memory_to_tensorboard, false,
          "Also write the allocator's current and peak bytes to TensorBoard.");
ABSL_FLAG(bool, dry_run, false,
          "Print tools/plan's prediction (memory by kind per rank, step time "
          "by part, MFU) for this layout on this machine and exit before "
          "allocating; exit code 1 when a rank will not fit.");
ABSL_FLAG(std::string, flight_recorder_dir, "",
          "Each rank dumps its last collectives and p2p calls here on a "
          "collective failure, SIGUSR1 or a fatal signal; tools/analyze_hang "
          "DIR names the ranks behind.");

ABSL_FLAG(bool, exit_signal_handler, false,
          "On SIGTERM (SLURM's warning before it ends a job, or tools/launch "
          "forwarding one), finish the step in hand, save a checkpoint to "
          "--save and exit 0, every rank after the same step (Megatron's "
          "flag). Under tools/launch give the save time with "
          "--grace-period-s.");
ABSL_FLAG(double, exit_duration_in_mins, 0,
          "Stop after the first step that ends this many minutes after the "
          "start, saving a checkpoint to --save first (Megatron's flag; 0: "
          "never).");
ABSL_FLAG(int64_t, exit_interval, 0,
          "Stop after an iteration that is a multiple of this, saving a "
          "checkpoint to --save first (Megatron's flag; 0: never).");
ABSL_FLAG(std::string, rerun_mode, "disabled",
          "validate_results: a step whose loss or gradient norm is not "
          "finite (or spikes, with --check-for-spiky-loss or "
          "--check-for-large-grads) is run again from the same state before "
          "the optimizer applies it; the log says whether the rerun "
          "reproduced it (the data or the model) or not (a transient fault "
          "of the machine; training goes on with the rerun's result). "
          "disabled: no check (Megatron's flag; its report_stats is not "
          "built).");
ABSL_FLAG(bool, check_for_spiky_loss, false,
          "With --rerun-mode validate_results, also rerun a step whose loss "
          "is above --spiky-loss-factor x the largest of the last 50 "
          "(Megatron's flag).");
ABSL_FLAG(bool, check_for_large_grads, false,
          "With --rerun-mode validate_results, also rerun a step whose "
          "gradient norm is above --spiky-loss-factor x the largest of the "
          "last 50 (Megatron's flag).");
ABSL_FLAG(double, spiky_loss_factor, 10,
          "The factor of --check-for-spiky-loss and --check-for-large-grads "
          "(a flag of ours; Megatron fixes it at 10).");
ABSL_FLAG(int64_t, error_injection_rate, 0,
          "With --rerun-mode validate_results, the check sees a NaN loss at "
          "every iteration that is a multiple of this (a drill of the rerun; "
          "training itself is unchanged; Megatron's flag, 0: never).");
ABSL_FLAG(std::string, error_injection_type, "transient_error",
          "transient_error (only the first run reads NaN), persistent_error "
          "(the rerun too) or correct_result (nothing reads wrong) "
          "(Megatron's flag).");
ABSL_FLAG(bool, log_straggler, false,
          "At every --log-interval, gather each rank's own time per step "
          "(busy: wall less the time blocked waiting on peers) and GEMM time, "
          "and log the slowest and fastest ranks with their ratios to the "
          "median, naming the ranks past --straggler-threshold (Megatron's "
          "flag).");
ABSL_FLAG(int32_t, straggler_minmax_count, 1,
          "How many slowest and fastest ranks --log-straggler lists "
          "(Megatron's flag).");
ABSL_FLAG(double, straggler_threshold, 1.2,
          "--log-straggler names a rank whose busy time per step is above "
          "this many times the median (a flag of ours; Megatron lists the "
          "slowest ranks without a threshold).");

ABSL_FLAG(bool, profile, false,
          "Record a timeline of --profile-ranks over the steps from "
          "--profile-step-start to --profile-step-end (Megatron's window): "
          "forward and backward per micro-batch and stage, every collective "
          "and p2p call, waits on neighbours, gradient sync, optimizer, "
          "checkpoint saves and data loading, as one Chrome trace per rank "
          "in --profile-dir (tools/merge_traces, tools/plot_timeline.py).");
ABSL_FLAG(int32_t, profile_step_start, 10,
          "Iterations done when --profile starts recording.");
ABSL_FLAG(int32_t, profile_step_end, 12,
          "Iterations done when --profile stops recording.");
ABSL_FLAG(std::string, profile_ranks, "0",
          "Global ranks --profile records: '0 1' as Megatron, or '0,1'.");
ABSL_FLAG(std::string, profile_dir, "profile",
          "Where --profile writes trace_rank<R>.json (not a Megatron flag: "
          "Megatron's --profile hands the window to Nsight Systems).");

namespace mcc {
namespace tools {
namespace {

constexpr int kFlagError = 2;

// --profile and its window, checked (errors name the flag).
absl::StatusOr<TimelineProfileConfig> TimelineProfileFromFlags(int world_size) {
  TimelineProfileConfig c;
  c.enabled = absl::GetFlag(FLAGS_profile);
  c.start = absl::GetFlag(FLAGS_profile_step_start);
  c.end = absl::GetFlag(FLAGS_profile_step_end);
  c.dir = absl::GetFlag(FLAGS_profile_dir);
  if (!c.enabled) return c;
  MCC_ASSIGN_OR_RETURN(
      c.ranks,
      ParseProfileRanks(absl::GetFlag(FLAGS_profile_ranks), world_size));
  MCC_RETURN_IF_ERROR(
      CheckTimelineProfile(c, absl::GetFlag(FLAGS_train_iters)));
  return c;
}

// Settings a preset gives to flags the user did not set.
absl::Status ApplyPreset(const std::set<std::string>& explicitly_set) {
  return flags::ApplyPreset(absl::GetFlag(FLAGS_preset), explicitly_set);
}

struct Batching {
  int64_t global_batch = 0;
  int num_microbatches = 1;
};

absl::StatusOr<Batching> PlanBatches(int dp) {
  Batching b;
  const int64_t mbs = absl::GetFlag(FLAGS_micro_batch_size);
  b.global_batch = absl::GetFlag(FLAGS_global_batch_size) > 0
                       ? absl::GetFlag(FLAGS_global_batch_size)
                       : mbs * dp;
  if (b.global_batch % (mbs * dp) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--global-batch-size (", b.global_batch,
                     ") is not divisible by --micro-batch-size (", mbs,
                     ") x data-parallel size (", dp, ")"));
  }
  b.num_microbatches = static_cast<int>(b.global_batch / (mbs * dp));
  return b;
}

absl::StatusOr<optim::OptimizerConfig> OptimizerConfigFromFlags() {
  optim::OptimizerConfig c;
  const std::string type = absl::GetFlag(FLAGS_optimizer);
  if (type == "adam" || type == "adamw") {
    c.type = optim::OptimizerType::kAdam;
  } else if (type == "sgd") {
    c.type = optim::OptimizerType::kSgd;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer: '", type, "' is not adam or sgd"));
  }
  c.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  c.adam_beta1 = absl::GetFlag(FLAGS_adam_beta1);
  c.adam_beta2 = absl::GetFlag(FLAGS_adam_beta2);
  c.adam_eps = absl::GetFlag(FLAGS_adam_eps);
  c.sgd_momentum = absl::GetFlag(FLAGS_sgd_momentum);
  c.clip_grad = absl::GetFlag(FLAGS_clip_grad);
  c.log_num_zeros_in_grad = absl::GetFlag(FLAGS_log_num_zeros_in_grad);
  c.loss_scaling = absl::GetFlag(FLAGS_fp16);
  c.loss_scaler.initial_scale = absl::GetFlag(FLAGS_initial_loss_scale);
  c.loss_scaler.min_scale = absl::GetFlag(FLAGS_min_loss_scale);
  c.loss_scaler.growth_interval = absl::GetFlag(FLAGS_loss_scale_window);
  c.loss_scaler.hysteresis = absl::GetFlag(FLAGS_hysteresis);
  c.loss_scaler.static_scale = absl::GetFlag(FLAGS_loss_scale);
  if (c.loss_scaling && c.loss_scaler.static_scale <= 0 &&
      !(c.loss_scaler.min_scale > 0 &&
        c.loss_scaler.min_scale <= c.loss_scaler.initial_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min-loss-scale (", c.loss_scaler.min_scale,
                     ") must be positive and at most --initial-loss-scale (",
                     c.loss_scaler.initial_scale, ")"));
  }
  return c;
}

absl::StatusOr<optim::LrSchedule> ScheduleFromFlags() {
  optim::LrScheduleConfig c;
  c.lr = absl::GetFlag(FLAGS_lr);
  c.min_lr = std::min(absl::GetFlag(FLAGS_min_lr), c.lr);
  c.warmup_iters = absl::GetFlag(FLAGS_lr_warmup_iters);
  c.warmup_fraction = absl::GetFlag(FLAGS_lr_warmup_fraction);
  c.decay_iters = absl::GetFlag(FLAGS_lr_decay_iters) > 0
                      ? absl::GetFlag(FLAGS_lr_decay_iters)
                      : absl::GetFlag(FLAGS_train_iters);
  MCC_ASSIGN_OR_RETURN(c.decay_style, optim::ParseLrDecayStyle(
                                          absl::GetFlag(FLAGS_lr_decay_style)));
  return optim::LrSchedule::Create(c);
}

// The early-exit flags, checked.
absl::StatusOr<training::ExitOptions> ExitOptionsFromFlags() {
  training::ExitOptions options;
  options.on_signal = absl::GetFlag(FLAGS_exit_signal_handler);
  const double minutes = absl::GetFlag(FLAGS_exit_duration_in_mins);
  if (!(minutes >= 0) || minutes > 365 * 24 * 60) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--exit-duration-in-mins must be 0 (none) or positive and at most a "
        "year, got ",
        minutes));
  }
  if (minutes > 0) options.max_duration = absl::Seconds(minutes * 60);
  options.interval = absl::GetFlag(FLAGS_exit_interval);
  if (options.interval < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--exit-interval must be 0 (none) or positive, got ",
                     options.interval));
  }
  return options;
}

// The rerun check's options; nullopt with --rerun-mode disabled.
absl::StatusOr<std::optional<training::RerunCheckOptions>>
RerunCheckOptionsFromFlags() {
  const std::string mode = absl::GetFlag(FLAGS_rerun_mode);
  if (mode != "disabled" && mode != "validate_results") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rerun-mode must be disabled or validate_results, got '", mode, "'",
        mode == "report_stats" ? " (report_stats is not built here)" : ""));
  }
  training::RerunCheckOptions options;
  options.check_spiky_loss = absl::GetFlag(FLAGS_check_for_spiky_loss);
  options.check_large_grads = absl::GetFlag(FLAGS_check_for_large_grads);
  options.spike_factor = absl::GetFlag(FLAGS_spiky_loss_factor);
  if (!(options.spike_factor > 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--spiky-loss-factor must be above 1, got ", options.spike_factor));
  }
  options.injection_rate = absl::GetFlag(FLAGS_error_injection_rate);
  if (options.injection_rate < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--error-injection-rate must be 0 (none) or positive, "
                     "got ",
                     options.injection_rate));
  }
  MCC_ASSIGN_OR_RETURN(
      options.injection,
      training::ParseInjection(absl::GetFlag(FLAGS_error_injection_type)));
  if (mode == "disabled") return std::nullopt;
  return options;
}

absl::Status CheckStragglerFlags() {
  if (absl::GetFlag(FLAGS_straggler_minmax_count) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--straggler-minmax-count must be at least 1, got ",
                     absl::GetFlag(FLAGS_straggler_minmax_count)));
  }
  if (!(absl::GetFlag(FLAGS_straggler_threshold) > 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--straggler-threshold must be above 1, got ",
                     absl::GetFlag(FLAGS_straggler_threshold)));
  }
  return absl::OkStatus();
}

// Every check that needs no process group; errors are flag errors.
absl::Status CheckTrainFlags(int world_size) {
  MCC_RETURN_IF_ERROR(ExitOptionsFromFlags().status());
  MCC_RETURN_IF_ERROR(CheckStragglerFlags());
  MCC_RETURN_IF_ERROR(RerunCheckOptionsFromFlags().status());
  MCC_RETURN_IF_ERROR(CheckDevice(absl::GetFlag(FLAGS_device)));
  MCC_RETURN_IF_ERROR(CheckFlagsBeforeLaunch(world_size));
  const int model_parallel = absl::GetFlag(FLAGS_tensor_model_parallel_size) *
                             absl::GetFlag(FLAGS_pipeline_model_parallel_size) *
                             absl::GetFlag(FLAGS_context_parallel_size);
  MCC_ASSIGN_OR_RETURN(Batching batching,
                       PlanBatches(world_size / model_parallel));
  MCC_ASSIGN_OR_RETURN(pipeline::PipelineConfig split,
                       flags::PipelineConfigFromFlags());
  MCC_RETURN_IF_ERROR(
      pipeline::ValidateMicroBatches(split, batching.num_microbatches));
  MCC_RETURN_IF_ERROR(OptimizerConfigFromFlags().status());
  MCC_RETURN_IF_ERROR(ScheduleFromFlags().status());
  MCC_RETURN_IF_ERROR(fsdp::ParseShardingStrategy(
                          absl::GetFlag(FLAGS_data_parallel_sharding_strategy))
                          .status());
  MCC_RETURN_IF_ERROR(CheckpointFlagsFromCommandLine().status());
  if (absl::GetFlag(FLAGS_train_iters) <= 0) {
    return absl::InvalidArgumentError("--train-iters must be positive");
  }
  if (absl::GetFlag(FLAGS_log_interval) <= 0) {
    return absl::InvalidArgumentError("--log-interval must be positive");
  }
  MCC_RETURN_IF_ERROR(TimelineProfileFromFlags(world_size).status());
  return absl::OkStatus();
}

// The step as the planner sees it (train --dry-run); flags are checked.
TrainSettings DryRunSettings(int world_size) {
  const int model_parallel = absl::GetFlag(FLAGS_tensor_model_parallel_size) *
                             absl::GetFlag(FLAGS_pipeline_model_parallel_size) *
                             absl::GetFlag(FLAGS_context_parallel_size);
  TrainSettings s;
  s.global_batch = PlanBatches(world_size / model_parallel)->global_batch;
  const fsdp::ShardingStrategy strategy =
      fsdp::ParseShardingStrategy(
          absl::GetFlag(FLAGS_data_parallel_sharding_strategy))
          .value_or(fsdp::ShardingStrategy::kNoShard);
  switch (strategy) {
    case fsdp::ShardingStrategy::kNoShard:
      s.zero = absl::GetFlag(FLAGS_use_distributed_optimizer)
                   ? planner::ZeroStage::kOptimizer
                   : planner::ZeroStage::kNone;
      break;
    case fsdp::ShardingStrategy::kOptim:
      s.zero = planner::ZeroStage::kOptimizer;
      break;
    case fsdp::ShardingStrategy::kOptimGrads:
      s.zero = planner::ZeroStage::kGradients;
      break;
    case fsdp::ShardingStrategy::kOptimGradsParams:
      s.zero = planner::ZeroStage::kParameters;
      break;
  }
  s.adam = absl::GetFlag(FLAGS_optimizer) != "sgd";
  s.overlap_grad_reduce = absl::GetFlag(FLAGS_overlap_grad_reduce);
  s.overlap_param_gather = absl::GetFlag(FLAGS_overlap_param_gather);
  s.overlap_p2p = !absl::GetFlag(FLAGS_no_overlap_p2p_communication);
  s.bucket_bytes = absl::GetFlag(FLAGS_ddp_bucket_size) * 4;
  return s;
}

// Flags this run never reads, refused before any process group forms.
std::vector<flags::UnusedFlag> RefusedFlags() {
  // As --save-interval and --async-save, which need --save DIR too.
  const bool no_save = absl::GetFlag(FLAGS_save).empty();
  const bool no_load = absl::GetFlag(FLAGS_load).empty();
  return {
      {"accumulate_allreduce_grads_in_fp32",
       !absl::GetFlag(FLAGS_accumulate_allreduce_grads_in_fp32),
       "gradients always accumulate and reduce in fp32 here (fp32 main "
       "gradients for every dtype); turning that off is not built"},
      {"keep_last", no_save, "it needs --save DIR"},
      {"no_load_optim", no_load, "it needs --load DIR"},
      {"no_load_rng", no_load, "it needs --load DIR"},
      // Under --device auto the model builder refuses it once the CPU is
      // chosen (ActivationOffloader::Create).
      {"cpu_offloading", absl::GetFlag(FLAGS_device) == "cpu",
       "the model is on the CPU, where activations already live in host "
       "memory: there is nothing to offload (it needs --device cuda)"},
      // Under --device auto, GraphedStage::Create refuses the CPU.
      {"cuda_graph", absl::GetFlag(FLAGS_device) == "cpu",
       "the CPU runs kernels as they are called: there is no device work "
       "to capture (it needs --device cuda)"},
  };
}

// Flags that matter only in other modes: each given one warns once.
std::vector<flags::UnusedFlag> IgnoredFlags(int world_size) {
  const int tp = absl::GetFlag(FLAGS_tensor_model_parallel_size);
  const int pp = absl::GetFlag(FLAGS_pipeline_model_parallel_size);
  const int dp = world_size / std::max(1, tp * pp);
  const bool mock = absl::GetFlag(FLAGS_mock_data);
  const bool fp16 = absl::GetFlag(FLAGS_fp16);
  const bool sgd = absl::GetFlag(FLAGS_optimizer) == "sgd";
  // CheckTrainFlags has parsed the strategy already.
  const fsdp::ShardingStrategy strategy =
      fsdp::ParseShardingStrategy(
          absl::GetFlag(FLAGS_data_parallel_sharding_strategy))
          .value_or(fsdp::ShardingStrategy::kNoShard);
  const bool per_unit_shards = fsdp::ShardsGradients(strategy);
  const bool distributed_optimizer =
      absl::GetFlag(FLAGS_use_distributed_optimizer) ||
      strategy == fsdp::ShardingStrategy::kOptim;
  const std::string decay = absl::GetFlag(FLAGS_lr_decay_style);
  const std::string no_dp = "the data-parallel size is 1";
  // No parameter has a replica on another rank to compare with.
  const bool no_replicas =
      dp == 1 && tp == 1 && absl::GetFlag(FLAGS_context_parallel_size) == 1 &&
      (pp == 1 || absl::GetFlag(FLAGS_untie_embeddings_and_output_weights));
  const std::string no_replicas_why =
      "no parameter is replicated on another rank (DP, TP and CP are 1 and "
      "no tied embedding spans pipeline stages)";
  const std::string loss_scaling = "loss scaling is fp16's (give --fp16)";
  const bool rerun = absl::GetFlag(FLAGS_rerun_mode) == "validate_results";
  const std::string no_rerun = "only --rerun-mode validate_results reads it";
  const std::string mock_why =
      "--mock-data draws tokens uniformly below --vocab-size; no files or "
      "tokenizer are read";
  const std::string per_unit =
      absl::StrCat("--data-parallel-sharding-strategy ",
                   fsdp::ShardingStrategyName(strategy),
                   " reduces each layer's gradients as its backward ends");
  const bool no_tensorboard = absl::GetFlag(FLAGS_tensorboard_dir).empty();
  const std::string tb_why = "it needs --tensorboard-dir";
  const bool no_profile = !absl::GetFlag(FLAGS_profile);
  const std::string profile_why = "it needs --profile";
  return {
      {"profile_step_start", no_profile, profile_why},
      {"profile_step_end", no_profile, profile_why},
      {"profile_ranks", no_profile, profile_why},
      {"profile_dir", no_profile, profile_why},
      {"tensorboard_log_interval", no_tensorboard, tb_why},
      {"log_timers_to_tensorboard", no_tensorboard, tb_why},
      {"log_memory_to_tensorboard", no_tensorboard, tb_why},
      {"num_query_groups", !absl::GetFlag(FLAGS_group_query_attention),
       "it needs --group-query-attention"},
      {"rotary_base", absl::GetFlag(FLAGS_position_embedding_type) != "rope",
       "it needs --position-embedding-type rope"},
      {"recompute_method", absl::GetFlag(FLAGS_recompute_granularity) != "full",
       "it needs --recompute-granularity full"},
      {"recompute_num_layers",
       absl::GetFlag(FLAGS_recompute_granularity) != "full",
       "it needs --recompute-granularity full"},
      {"cpu_offloading_num_layers", !absl::GetFlag(FLAGS_cpu_offloading),
       "it needs --cpu-offloading"},
      {"cp_comm_type", absl::GetFlag(FLAGS_context_parallel_size) == 1,
       "it needs --context-parallel-size > 1"},
      {"sequence_parallel", tp == 1,
       "it splits activations over tensor-parallel ranks "
       "(--tensor-model-parallel-size 1)"},
      {"no_overlap_p2p_communication", pp == 1,
       "only pipeline transfers overlap (--pipeline-model-parallel-size 1)"},
      {"vocab_size", !mock,
       "the tokenizer's vocabulary is the model's (--vocab-size is for "
       "--mock-data)"},
      {"data_path", mock, mock_why},
      {"split", mock, mock_why},
      {"tokenizer_type", mock, mock_why},
      {"vocab_file", mock, mock_why},
      {"merge_file", mock, mock_why},
      {"tokenizer_model", mock, mock_why},
      {"tokenizer_model",
       !mock && !data::TokenizerReadsFlag(absl::GetFlag(FLAGS_tokenizer_type),
                                          "tokenizer_model"),
       "only SentencePieceTokenizer and HuggingFaceTokenizer read it"},
      {"data_cache_path", mock, mock_why},
      {"eod_mask_loss", mock, mock_why},
      {"vocab_file",
       !mock && absl::GetFlag(FLAGS_tokenizer_type) != "GPT2BPETokenizer",
       "only GPT2BPETokenizer reads it"},
      {"merge_file",
       !mock && absl::GetFlag(FLAGS_tokenizer_type) != "GPT2BPETokenizer",
       "only GPT2BPETokenizer reads it"},
      {"eval_interval", absl::GetFlag(FLAGS_eval_iters) == 0,
       "--eval-iters 0 turns evaluation off"},
      {"lr_warmup_iters", absl::GetFlag(FLAGS_lr_warmup_fraction) >= 0,
       "--lr-warmup-fraction sets the warmup"},
      {"min_lr", decay == "constant", "--lr-decay-style constant"},
      {"lr_decay_iters",
       (decay == "constant" || decay == "inverse-square-root") &&
           absl::GetFlag(FLAGS_lr_warmup_fraction) < 0,
       "--lr-decay-style " + decay + " has no decay length"},
      {"adam_beta1", sgd, "--optimizer sgd"},
      {"adam_beta2", sgd, "--optimizer sgd"},
      {"adam_eps", sgd, "--optimizer sgd"},
      {"sgd_momentum", !sgd, "--optimizer adam"},
      {"loss_scale", !fp16, loss_scaling},
      {"initial_loss_scale", !fp16 || absl::GetFlag(FLAGS_loss_scale) > 0,
       fp16 ? "--loss-scale sets a static scale" : loss_scaling},
      {"min_loss_scale", !fp16 || absl::GetFlag(FLAGS_loss_scale) > 0,
       fp16 ? "--loss-scale sets a static scale" : loss_scaling},
      {"loss_scale_window", !fp16 || absl::GetFlag(FLAGS_loss_scale) > 0,
       fp16 ? "--loss-scale sets a static scale" : loss_scaling},
      {"hysteresis", !fp16 || absl::GetFlag(FLAGS_loss_scale) > 0,
       fp16 ? "--loss-scale sets a static scale" : loss_scaling},
      {"overlap_grad_reduce", dp == 1 || per_unit_shards,
       dp == 1 ? no_dp : per_unit},
      {"ddp_bucket_size", dp == 1 || per_unit_shards,
       dp == 1 ? no_dp : per_unit},
      {"overlap_param_gather",
       dp == 1 || per_unit_shards || !distributed_optimizer,
       dp == 1           ? no_dp
       : per_unit_shards ? per_unit
                         : "only the distributed optimizer gathers "
                           "parameters (--use-distributed-optimizer)"},
      {"check_weight_hash_across_dp_replicas_interval", no_replicas,
       no_replicas_why},
      {"check_grad_consistency_interval", no_replicas, no_replicas_why},
      {"debug_collectives", world_size == 1,
       "a single process makes no collectives"},
      {"distributed_timeout_minutes", world_size == 1,
       "a single process makes no collectives"},
      {"check_for_spiky_loss", !rerun, no_rerun},
      {"check_for_large_grads", !rerun, no_rerun},
      {"spiky_loss_factor",
       !rerun || (!absl::GetFlag(FLAGS_check_for_spiky_loss) &&
                  !absl::GetFlag(FLAGS_check_for_large_grads)),
       "only --check-for-spiky-loss and --check-for-large-grads under "
       "--rerun-mode validate_results read it"},
      {"error_injection_rate", !rerun, no_rerun},
      {"error_injection_type",
       !rerun || absl::GetFlag(FLAGS_error_injection_rate) == 0,
       "errors are injected only with --error-injection-rate under "
       "--rerun-mode validate_results"},
      {"straggler_minmax_count", !absl::GetFlag(FLAGS_log_straggler),
       "only --log-straggler lists ranks"},
      {"straggler_threshold", !absl::GetFlag(FLAGS_log_straggler),
       "only --log-straggler names stragglers"},
  };
}

// The per-layer gradient-norm line's group of a parameter (by its global
// name): 0 the embeddings, 1 + i decoder layer i, layers + 1 the head
// (final norm and output layer).
int LayerGroupOf(const Parameter& p, int layers) {
  absl::string_view name = p.name;
  if (absl::StartsWith(name, "embedding.")) return 0;
  int i = 0;
  if (absl::ConsumePrefix(&name, "decoder.layers.") &&
      absl::SimpleAtoi(name.substr(0, name.find('.')), &i) && i >= 0 &&
      i < layers) {
    return 1 + i;
  }
  return layers + 1;
}

// "gradient norm by layer: embedding 0.12 | layer 0 0.5 | ... | head 0.3".
std::string FormatLayerGradNorms(const std::vector<double>& norms) {
  std::vector<std::string> parts;
  for (size_t g = 0; g < norms.size(); ++g) {
    const std::string label = g == 0 ? std::string("embedding")
                              : g + 1 == norms.size()
                                  ? std::string("head")
                                  : absl::StrCat("layer ", g - 1);
    parts.push_back(absl::StrFormat("%s %.4g", label, norms[g]));
  }
  return absl::StrCat("gradient norm by layer: ", absl::StrJoin(parts, " | "));
}

// Data parallelism by --data-parallel-sharding-strategy (optim is DDP with
// the distributed optimizer, as --use-distributed-optimizer).
absl::StatusOr<std::unique_ptr<data_parallel::DataParallel>> MakeDataParallel(
    Job& job, const data_parallel::DdpConfig& ddp_config) {
  MCC_ASSIGN_OR_RETURN(fsdp::ShardingStrategy strategy,
                       fsdp::ParseShardingStrategy(absl::GetFlag(
                           FLAGS_data_parallel_sharding_strategy)));
  if (strategy == fsdp::ShardingStrategy::kNoShard &&
      ddp_config.use_distributed_optimizer) {
    strategy = fsdp::ShardingStrategy::kOptim;
  }
  fsdp::FsdpConfig config;
  config.strategy = strategy;
  config.ddp = ddp_config;
  return training::WrapDataParallel(training::AsModels(job.model->chunks()),
                                    job.grad_dp(), job.pp(), config);
}

// --check-for-nan-in-loss-and-grad: an error naming the iteration, rank
// and first non-finite tensor when the step's loss, or a gradient where no
// loss scaler skips such steps by design, is inf or NaN. Every rank of the
// data-parallel group sees the same loss and skip, so all stop together.
absl::Status CheckForNan(const Job& job, const optim::Optimizer& optimizer,
                         const training::StepMetrics& step) {
  const bool bad_loss = !std::isfinite(step.loss);
  const bool bad_grad = step.skipped && !optimizer.config().loss_scaling;
  if (!bad_loss && !bad_grad) return absl::OkStatus();
  std::string where = "the gradients are finite";
  if (step.skipped) {
    MCC_ASSIGN_OR_RETURN(std::string first, optimizer.FirstNonFiniteGradient());
    where = first.empty() ? "no gradient on this rank is non-finite (another "
                            "rank's is)"
                          : absl::StrCat("first non-finite gradient: ", first);
  }
  const std::string what =
      absl::StrCat("iteration ", step.iteration, ", rank ", job.rank, ": ",
                   bad_loss ? absl::StrCat("the loss is ", step.loss)
                            : "the gradients hold inf or NaN",
                   "; ", where);
  if (!absl::GetFlag(FLAGS_check_for_nan_in_loss_and_grad)) {
    LOG(WARNING) << what << " (--check-for-nan-in-loss-and-grad=false: "
                 << "training on)";
    return absl::OkStatus();
  }
  return absl::InternalError(
      absl::StrCat(what, " (--check-for-nan-in-loss-and-grad)"));
}

// Fault injection for the elastic-restart test: with
// MCC_CHAOS_KILL_AT_ITERATION=N and MCC_CHAOS_KILL_RANK=R, rank R kills
// itself (SIGKILL) once iteration N is done, in the job's first attempt
// only (TORCHELASTIC_RESTART_COUNT unset or 0), so the restarted job runs
// to the end. A deterministic moment, where killing from outside races a
// fast run.
void ChaosKillAfterIteration(int64_t iteration) {
  static const char* const at = std::getenv("MCC_CHAOS_KILL_AT_ITERATION");
  if (at == nullptr || std::atoll(at) != iteration) return;
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (restarts != nullptr && std::atoi(restarts) != 0) return;
  const char* rank = std::getenv("RANK");
  const char* victim = std::getenv("MCC_CHAOS_KILL_RANK");
  if (victim != nullptr && (rank == nullptr || std::strcmp(rank, victim) != 0))
    return;
  LOG(WARNING) << "MCC_CHAOS_KILL_AT_ITERATION=" << at << ": killing rank "
               << (rank ? rank : "0") << " with SIGKILL";
  google::FlushLogFiles(google::GLOG_INFO);
  raise(SIGKILL);
}

// Fault injection for the straggler test: with MCC_CHAOS_SLOW_RANK=R and
// MCC_CHAOS_SLOW_MS=M, rank R sleeps M ms before each step, as a rank on a
// slow node would take longer, so --log-straggler must name it.
void ChaosSlowStep() {
  static const char* const victim = std::getenv("MCC_CHAOS_SLOW_RANK");
  static const char* const ms = std::getenv("MCC_CHAOS_SLOW_MS");
  if (victim == nullptr || ms == nullptr) return;
  const char* rank = std::getenv("RANK");
  if (std::strcmp(rank != nullptr ? rank : "0", victim) != 0) return;
  absl::SleepFor(absl::Milliseconds(std::atoi(ms)));
}

// A failed checkpoint save: the error itself (the run stops), or, with
// --continue-on-save-failure, OK after logging it. The save's collectives
// agree on its status, so every rank decides alike.
absl::Status SaveFailure(const absl::Status& saved,
                         const CheckpointFlags& ckpt) {
  if (saved.ok() || !ckpt.continue_on_save_failure) return saved;
  LOG(ERROR) << "checkpoint save failed: " << saved
             << "; training continues (--continue-on-save-failure); the "
                "previous checkpoint under "
             << ckpt.save << " is intact";
  return absl::OkStatus();
}

// Mean loss over `iters` micro-batches of a split (no gradients), through
// the pipeline when there is one.
absl::StatusOr<double> Evaluate(Job& job, training::Trainer* trainer,
                                data::DataLoader* loader, int iters) {
  std::vector<gpt::MicroBatch> batches;
  for (int i = 0; i < iters; ++i) {
    auto mb = loader->Next();
    if (absl::IsOutOfRange(mb.status())) break;
    MCC_RETURN_IF_ERROR(mb.status());
    batches.push_back({mb->tokens, mb->labels, mb->loss_mask});
  }
  const int n = static_cast<int>(batches.size());
  MCC_RETURN_IF_ERROR(job.model->SetMicroBatches(std::move(batches)));
  MCC_ASSIGN_OR_RETURN(training::EvalMetrics eval, trainer->Evaluate(n));
  return eval.loss;
}

// Per-stage pipeline timers over a logging window, gathered to every rank
// and logged by the logging rank beside the schedule's theoretical bubble.
absl::Status LogPipelineStats(const Job& job,
                              const pipeline::PipelineStats& window,
                              const std::string& schedule) {
  // Host scalars: over the pipeline group's host twin.
  comm::ProcessGroup* pp = job.GroupFor(job.pp(), Device::CPU());
  if (pp == nullptr) return absl::OkStatus();
  Tensor mine =
      *Tensor::FromVector({static_cast<float>(window.forward_seconds),
                           static_cast<float>(window.backward_seconds),
                           static_cast<float>(window.wait_seconds),
                           static_cast<float>(window.total_seconds),
                           static_cast<float>(window.max_in_flight)},
                          {5});
  Tensor all = Tensor::Empty({pp->size() * 5}, DType::kFloat32);
  MCC_RETURN_IF_ERROR(pp->AllGatherSync(mine, &all));
  if (!job.is_logging_rank()) return absl::OkStatus();
  const float* a = all.data<float>();
  for (int s = 0; s < pp->size(); ++s) {
    const float* v = a + 5 * s;
    const double bubble =
        v[3] > 0 ? std::max(0.0, 1.0 - (v[0] + v[1]) / v[3]) : 0;
    LOG(INFO) << absl::StrFormat(
        "pipeline stage %d/%d (%s): forward %.3f s | backward %.3f s | "
        "waiting on neighbours %.3f s | schedule %.3f s | activations held "
        "<= %d micro-batches | bubble measured %.3f, theoretical %.3f",
        s, pp->size(), schedule, v[0], v[1], v[2], v[3], static_cast<int>(v[4]),
        bubble, window.theoretical_bubble);
  }
  return absl::OkStatus();
}

// How gradients, parameters and pipeline transfers move in this run, read
// from the objects that move them (so the log shows what the flags did).
std::string DescribeDistribution(
    const Job& job, const data_parallel::DataParallel& dp,
    const pipeline::PipelineOptions& pipeline_options) {
  std::string out = absl::StrCat("data parallel: ", dp.Describe());
  if (job.context.sequence_parallel && job.tp() != nullptr &&
      job.tp()->size() > 1) {
    absl::StrAppend(&out, "; sequence parallel: norms and dropout split over ",
                    job.tp()->size(), " tensor-parallel ranks");
  }
  if (job.pp() != nullptr) {
    // Layers per stage (and virtual stage), as the split flags set them.
    std::vector<std::string> stages;
    for (int p = 0; p < job.pipeline.pipeline_size; ++p) {
      auto ranges = pipeline::StageLayers(job.pipeline, p);
      if (!ranges.ok()) continue;
      std::vector<std::string> chunks;
      for (const pipeline::LayerRange& r : *ranges) {
        chunks.push_back(absl::StrCat(r.first, "-", r.first + r.count - 1));
      }
      stages.push_back(absl::StrJoin(chunks, "+"));
    }
    absl::StrAppend(&out, "; layers by stage ", absl::StrJoin(stages, " | "));
    absl::StrAppend(&out, "; pipeline transfers ",
                    pipeline_options.overlap_p2p ? "overlapped with compute"
                                                 : "waited for");
  }
  if (job.world.has_value() && job.world->group->options().debug_collectives) {
    absl::StrAppend(&out, "; every collective's fingerprint checked");
  }
  return out;
}

// --flight-recorder-dir: set before any group forms, so every collective is
// in the ring.
absl::Status SetUpFlightRecorder() {
  const std::string dir = absl::GetFlag(FLAGS_flight_recorder_dir);
  if (dir.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--flight-recorder-dir ", dir, ": cannot create it: ", ec.message()));
  }
  int rank = 0;
  const char* env = std::getenv("RANK");
  if (env == nullptr || !absl::SimpleAtoi(env, &rank)) rank = 0;
  comm::FlightRecorder::Global().SetDumpDirectory(dir, rank);
  if (rank == 0) {
    LOG(INFO) << "flight recorder: each rank dumps its last collectives to "
              << dir << " on a failure, SIGUSR1 or a fatal signal "
              << "(tools/analyze_hang " << dir << ")";
  }
  return absl::OkStatus();
}

// --tensorboard-dir: scalars under Megatron's tag names, from rank 0.
class TensorBoardLog {
 public:
  static absl::StatusOr<TensorBoardLog> Create(bool log) {
    TensorBoardLog tb;
    const std::string dir = absl::GetFlag(FLAGS_tensorboard_dir);
    if (dir.empty() || !log) return tb;
    MCC_ASSIGN_OR_RETURN(tb.writer_,
                         observability::TensorBoardWriter::Create(dir));
    LOG(INFO) << "TensorBoard: writing event files to " << dir;
    return tb;
  }
  bool enabled() const { return writer_ != nullptr; }
  absl::Status Add(absl::string_view tag, double value, int64_t step) {
    return writer_ ? writer_->AddScalar(tag, value, step) : absl::OkStatus();
  }
  absl::Status Flush() { return writer_ ? writer_->Flush() : absl::OkStatus(); }

 private:
  std::shared_ptr<observability::TensorBoardWriter> writer_;
};

// --cuda-graph with flags that put communication or host work inside the
// captured micro-batch: refused, naming them. (GraphedStage::Create refuses
// what the model itself cannot capture: PP, TP, CP, dropout, offloading.)
absl::Status CheckCudaGraphFlags(int num_chunks) {
  const char* clash = nullptr;
  if (absl::GetFlag(FLAGS_overlap_grad_reduce)) {
    clash = "--overlap-grad-reduce (reduces gradients inside the backward)";
  } else if (absl::GetFlag(FLAGS_overlap_param_gather)) {
    clash = "--overlap-param-gather (gathers parameters inside the forward)";
  } else if (fsdp::ShardsGradients(
                 fsdp::ParseShardingStrategy(
                     absl::GetFlag(FLAGS_data_parallel_sharding_strategy))
                     .value_or(fsdp::ShardingStrategy::kNoShard))) {
    clash =
        "--data-parallel-sharding-strategy that shards gradients (reduces "
        "and gathers per unit inside the forward and backward)";
  } else if (num_chunks != 1) {
    clash = "virtual pipeline stages (several model chunks per rank)";
  }
  if (clash == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--cuda-graph cannot be combined with ", clash));
}

// `exit_conditions` (from main, so that SIGTERM is caught from the start to
// the process's end) gets the world here.
absl::Status Train(training::ExitConditions* exit_conditions) {
  MCC_RETURN_IF_ERROR(SetUpFlightRecorder());
  MCC_ASSIGN_OR_RETURN(DeviceChoice device,
                       ChooseDevice(absl::GetFlag(FLAGS_device)));
  MCC_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, SetupJob(std::move(device)));
  const int dp = job->dp_size();
  MCC_ASSIGN_OR_RETURN(Batching batching, PlanBatches(dp));
  const int64_t train_iters = absl::GetFlag(FLAGS_train_iters);
  const int64_t seq = job->config.seq_length;
  const bool log = job->is_logging_rank();

  // Peak for MFU: measured on rank 0 alone while the others wait.
  double peak_flops = absl::GetFlag(FLAGS_peak_tflops) * 1e12;
  if (peak_flops <= 0 && log) {
    peak_flops = MeasureGemmPeakFlops(job->context.dtype, job->context.device);
  }
  // A run that saves where it loads repairs what a killed save left there
  // (rank 0, before any rank reads it; checkpoint_dir.h).
  MCC_ASSIGN_OR_RETURN(CheckpointFlags ckpt, CheckpointFlagsFromCommandLine());
  if (log && !ckpt.load.empty() && SameDirectory(ckpt.load, ckpt.save)) {
    MCC_RETURN_IF_ERROR(RepairCheckpointDir(ckpt.load));
  }
  MCC_RETURN_IF_ERROR(job->Barrier());

  // Resume: the model first, so data parallelism and the optimizer take
  // their copies from the loaded weights.
  TrainingProgress progress;
  MCC_ASSIGN_OR_RETURN(const bool resumed,
                       ShouldResume(ckpt.load, ckpt.save, log));
  if (resumed) {
    MCC_ASSIGN_OR_RETURN(
        progress, LoadModelCheckpoint(ckpt.load, *job, !ckpt.no_load_rng));
  }

  // Data parallelism and the optimizer.
  data_parallel::DdpConfig ddp_config;
  ddp_config.overlap_grad_reduce = absl::GetFlag(FLAGS_overlap_grad_reduce);
  ddp_config.use_distributed_optimizer =
      absl::GetFlag(FLAGS_use_distributed_optimizer);
  ddp_config.overlap_param_gather = absl::GetFlag(FLAGS_overlap_param_gather);
  ddp_config.bucket_size_bytes = absl::GetFlag(FLAGS_ddp_bucket_size) * 4;
  MCC_ASSIGN_OR_RETURN(auto ddp, MakeDataParallel(*job, ddp_config));
  // The schedule: 1F1B across stages (interleaved with virtual stages),
  // plain gradient accumulation on one.
  pipeline::PipelineOptions pipeline_options;
  pipeline_options.schedule = job->pp() != nullptr
                                  ? pipeline::ScheduleKind::kOneFOneB
                                  : pipeline::ScheduleKind::kNoPipelining;
  pipeline_options.overlap_p2p =
      !absl::GetFlag(FLAGS_no_overlap_p2p_communication);
  // --cuda-graph: the one chunk's micro-batches captured and replayed
  // (models/gpt/graphed_stage.h refuses the layouts it cannot cover).
  std::unique_ptr<gpt::GraphedStage> graphed;
  std::vector<parallel::PipelineStage*> stages = job->model->stages();
  if (absl::GetFlag(FLAGS_cuda_graph)) {
    MCC_RETURN_IF_ERROR(CheckCudaGraphFlags(job->model->num_chunks()));
    MCC_ASSIGN_OR_RETURN(graphed,
                         gpt::GraphedStage::Create(job->model->chunk(0)));
    stages = {graphed.get()};
  }
  MCC_ASSIGN_OR_RETURN(auto executor, pipeline::PipelineExecutor::Create(
                                          stages, job->pp(), pipeline_options));
  const std::string schedule_name = pipeline::ScheduleName(
      job->model->num_chunks() > 1 ? pipeline::ScheduleKind::kInterleaved
                                   : pipeline_options.schedule);
  MCC_ASSIGN_OR_RETURN(optim::OptimizerConfig opt_config,
                       OptimizerConfigFromFlags());
  optim::OptimizerGroups groups;
  groups.tensor = job->tp();
  groups.pipeline = job->state ? job->state->pipeline() : nullptr;
  groups.model = job->state ? job->state->model() : nullptr;
  MCC_ASSIGN_OR_RETURN(auto optimizer,
                       ddp->CreateOptimizer(opt_config, groups));
  MCC_ASSIGN_OR_RETURN(optim::LrSchedule schedule, ScheduleFromFlags());
  // The step: micro-batches through the schedule, gradient sync and
  // finalisation, loss scale, clipping, the optimizer.
  training::TrainerParts parts;
  parts.models = training::AsModels(job->model->chunks());
  parts.executor = executor.get();
  parts.data_parallel = ddp.get();
  parts.optimizer = optimizer.get();
  parts.dp_group = job->dp();
  parts.context_group = job->cp();
  // Tied embedding and output weights on the first and last stages.
  parts.embedding_group =
      job->pp() != nullptr ? job->state->embedding() : nullptr;
  // The cross-rank consistency checks' replica groups.
  data_parallel::ReplicaGroupSources replica_sources;
  if (job->state != nullptr) {
    replica_sources.data = job->state->data();
    replica_sources.tensor = job->state->tensor();
    replica_sources.context = job->state->context();
    replica_sources.embedding = job->state->embedding();
  }
  const int grad_check_interval =
      absl::GetFlag(FLAGS_check_grad_consistency_interval);
  const int log_interval = absl::GetFlag(FLAGS_log_interval);
  auto is_log_iteration = [&](int64_t iteration) {
    return iteration % log_interval == 0 || iteration == train_iters;
  };
  const bool per_layer_grad_norms = absl::GetFlag(FLAGS_timing_log_level) >= 2;
  std::vector<double> layer_grad_norms;
  training::TrainerOptions trainer_options;
  // --rerun-mode validate_results: what the check saw of the first run.
  MCC_ASSIGN_OR_RETURN(std::optional<training::RerunCheckOptions> rerun_options,
                       RerunCheckOptionsFromFlags());
  std::optional<training::RerunCheck> rerun_check;
  double first_seen_loss = 0, first_seen_grad_norm = 0;
  std::string rerun_suspicion;
  uint64_t rng_calls_before_step = 0;
  if (rerun_options.has_value()) {
    rerun_check.emplace(*rerun_options);
    if (job->is_logging_rank()) {
      std::string checks = "non-finite losses and gradient norms";
      if (rerun_options->check_spiky_loss) {
        absl::StrAppend(&checks, ", losses above ", rerun_options->spike_factor,
                        "x the recent largest");
      }
      if (rerun_options->check_large_grads) {
        absl::StrAppend(&checks, ", gradient norms above ",
                        rerun_options->spike_factor, "x the recent largest");
      }
      LOG(INFO) << "rerun check (--rerun-mode validate_results): steps with "
                << checks << " rerun once from the same state"
                << (rerun_options->injection_rate > 0
                        ? absl::StrCat(
                              "; injecting ",
                              absl::GetFlag(FLAGS_error_injection_type),
                              " every ", rerun_options->injection_rate,
                              " iterations")
                        : "");
    }
    trainer_options.rerun_step_if =
        [&](int64_t iteration, double loss,
            double grad_norm) -> absl::StatusOr<bool> {
      first_seen_loss = rerun_check->SeenLoss(iteration, loss, false);
      first_seen_grad_norm = grad_norm;
      rerun_suspicion = rerun_check->Suspicion(first_seen_loss, grad_norm);
      // Every rank reruns or none: a step is rerun if any rank saw cause.
      int64_t rerun = rerun_suspicion.empty() ? 0 : 1;
      if (job->world.has_value()) {
        MCC_ASSIGN_OR_RETURN(Tensor t, Tensor::FromInts({rerun}, {1}));
        MCC_RETURN_IF_ERROR(
            job->world->group->AllReduceSync(&t, comm::ReduceOp::kMax));
        rerun = t.data<int64_t>()[0];
      }
      if (rerun != 0 && rerun_suspicion.empty()) {
        rerun_suspicion = "another rank saw cause";
      }
      return rerun != 0;
    };
    // The rerun draws the first run's dropout masks again.
    trainer_options.before_rerun = [&]() -> absl::Status {
      job->model->set_rng_calls(rng_calls_before_step);
      return absl::OkStatus();
    };
  }
  trainer_options.before_optimizer_step =
      [&](int64_t iteration) -> absl::Status {
    if (grad_check_interval > 0 && iteration % grad_check_interval == 0) {
      const std::vector<data_parallel::ReplicaGroup> groups =
          data_parallel::GradientReplicaGroups(job->model->parameters(),
                                               replica_sources, ddp.get());
      absl::Status s = data_parallel::CheckGradConsistencyAcrossReplicaGroups(
          groups, data_parallel::HeldGradientsOf(ddp.get()));
      if (!s.ok()) {
        return absl::Status(
            s.code(),
            absl::StrCat("--check-grad-consistency-interval: iteration ",
                         iteration, ", rank ", job->rank, ": ", s.message()));
      }
      if (log && !groups.empty()) {
        std::vector<std::string> compared;
        for (const auto& g : groups) {
          compared.push_back(absl::StrCat(g.kind, " (", g.group->size(), ")"));
        }
        LOG(INFO) << "iteration " << iteration
                  << ": reduced gradients identical across "
                  << absl::StrJoin(compared, ", ") << " replicas";
      }
    }
    if (per_layer_grad_norms && is_log_iteration(iteration)) {
      // Embedding, each layer, then the head (final norm and output layer).
      const int layers = job->config.num_layers;
      MCC_ASSIGN_OR_RETURN(
          layer_grad_norms,
          optimizer->GradNormsByGroup(layers + 2, [layers](const Parameter& p) {
            return LayerGroupOf(p, layers);
          }));
    }
    return absl::OkStatus();
  };
  MCC_ASSIGN_OR_RETURN(
      auto trainer,
      training::Trainer::Create(parts, schedule, std::move(trainer_options)));
  if (resumed && !ckpt.no_load_optim) {
    // Sharded parameters are made whole around loads and saves.
    MCC_RETURN_IF_ERROR(ddp->GatherFullParams());
    MCC_RETURN_IF_ERROR(
        LoadOptimizerCheckpoint(ckpt.load, *job, optimizer.get()));
    MCC_RETURN_IF_ERROR(ddp->ReleaseFullParams());
  }
  // Checkpoints travel over a group of their own, so an asynchronous save
  // never interleaves with training's collectives.
  std::shared_ptr<comm::ProcessGroup> ckpt_group;
  if (!ckpt.save.empty() && job->world.has_value()) {
    std::vector<int> all(job->world_size);
    for (int r = 0; r < job->world_size; ++r) all[r] = r;
    MCC_ASSIGN_OR_RETURN(ckpt_group, job->world->group->NewSubgroup(all));
  }
  const DistContext dist = MakeDistContext(ckpt_group.get());
  AsyncCheckpointSaver async_saver;

  // Data.
  const int eval_iters = absl::GetFlag(FLAGS_eval_iters);
  const int eval_interval = std::max(1, absl::GetFlag(FLAGS_eval_interval));
  const int64_t eval_samples =
      std::max<int64_t>(1, (train_iters / eval_interval + 1) * eval_iters *
                               batching.global_batch);
  MCC_ASSIGN_OR_RETURN(
      auto datasets,
      BuildDatasets(
          *job, {train_iters * batching.global_batch, eval_samples,
                 std::max<int64_t>(1, eval_iters * batching.global_batch)}));
  data::LoaderConfig loader_config;
  loader_config.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  loader_config.dp_rank = job->dp_rank();
  loader_config.dp_size = dp;
  loader_config.consumed_samples = progress.consumed_train_samples;
  if (job->tokenizer != nullptr) {
    loader_config.eod = job->tokenizer->eod();
    loader_config.eod_mask_loss = absl::GetFlag(FLAGS_eod_mask_loss);
  }
  MCC_ASSIGN_OR_RETURN(auto train_loader,
                       data::DataLoader::Create(datasets[0], loader_config));
  data::LoaderConfig eval_loader_config = loader_config;
  eval_loader_config.consumed_samples = 0;

  MetricsLogger logger(log, absl::GetFlag(FLAGS_metrics_file));
  MCC_ASSIGN_OR_RETURN(TensorBoardLog tensorboard, TensorBoardLog::Create(log));
  const int tb_interval =
      std::max(1, absl::GetFlag(FLAGS_tensorboard_log_interval));
  const double flops_per_iteration =
      TrainingFlopsPerToken(job->config) * batching.global_batch * seq;
  if (log) {
    int64_t params = 0;
    for (const auto& p : job->model->parameters())
      params += NumElements(p->global_shape);
    LOG(INFO) << absl::StrFormat(
        "training a %s: %d layers, hidden %d, %d heads, vocabulary %d (%d "
        "rows with the padding for TP), sequence %d; %.2fM parameters on "
        "this stage; world %d (TP %d, PP %d, DP %d; %s); global batch %d = "
        "micro-batch %d x DP %d x %d micro-batches; %s",
        job->config.Architecture(), job->config.num_layers,
        job->config.hidden_size, job->config.num_attention_heads,
        job->config.vocab_size,
        job->config.padded_vocab_size(
            absl::GetFlag(FLAGS_tensor_model_parallel_size)),
        seq, params / 1e6, job->world_size,
        absl::GetFlag(FLAGS_tensor_model_parallel_size),
        job->pipeline.pipeline_size, dp, schedule_name, batching.global_batch,
        absl::GetFlag(FLAGS_micro_batch_size), dp, batching.num_microbatches,
        DTypeName(job->context.dtype));
    LOG(INFO) << absl::StrFormat("GEMM peak for MFU: %.1f GFLOP/s",
                                 peak_flops / 1e9);
    LOG(INFO) << DescribeDistribution(*job, *ddp, pipeline_options);
  }

  Timers timers;
  const bool profile_ops = absl::GetFlag(FLAGS_timing_log_level) >= 2;
  OpProfile::Enable(profile_ops);
  OpProfile::Reset();
  comm::ProcessGroup* const world_group =
      job->world.has_value() ? job->world->group.get() : nullptr;
  std::optional<training::StragglerDetector> straggler;
  int straggler_steps = 0;  // In the detector's window.
  if (absl::GetFlag(FLAGS_log_straggler)) {
    straggler.emplace(world_group, absl::GetFlag(FLAGS_straggler_threshold));
  }
  const training::ExitOptions& exit_options = exit_conditions->options();
  exit_conditions->SetWorld(world_group);
  bool stopped_early = false;
  if (log && exit_options.on_signal) {
    LOG(INFO) << "--exit-signal-handler: on SIGTERM every rank finishes the "
                 "step in hand, "
              << (ckpt.save.empty() ? "(no --save: saves nothing) "
                                    : "saves to --save ")
              << "and exits 0";
  }
  // Saves the state after `iteration` to --save.
  auto save_checkpoint = [&](int64_t iteration) -> absl::Status {
    timers.Start("save-checkpoint");
    observability::TraceScope trace("checkpoint save", "checkpoint");
    TrainingProgress now{iteration, iteration * batching.global_batch};
    MCC_RETURN_IF_ERROR(ddp->GatherFullParams());
    // With --async-save this also reports the previous save's failure.
    const absl::Status saved = SaveTrainingCheckpoint(
        ckpt.save, *job, optimizer.get(), schedule, now, dist,
        ckpt.async_save ? &async_saver : nullptr, ckpt.keep_last);
    MCC_RETURN_IF_ERROR(ddp->ReleaseFullParams());
    timers.Stop("save-checkpoint");
    MCC_RETURN_IF_ERROR(SaveFailure(saved, ckpt));
    if (log && saved.ok()) {
      LOG(INFO) << (ckpt.async_save ? "saving (in the background) " : "saved ")
                << ckpt.save << "/" << IterationDirName(iteration);
    }
    return absl::OkStatus();
  };
  bool warned_mfu_above_peak = false;
  pipeline::PipelineStats pipeline_window;
  int64_t skipped = 0;
  const absl::Time start = absl::Now();
  absl::Time window_start = start;
  double window_loss = 0;
  int window_steps = 0;
  if (progress.iteration >= train_iters && log) {
    LOG(INFO) << "the loaded checkpoint is at iteration " << progress.iteration
              << " of --train-iters " << train_iters << ": nothing to train";
  }
  const int hash_interval =
      absl::GetFlag(FLAGS_check_weight_hash_across_dp_replicas_interval);
  MCC_ASSIGN_OR_RETURN(TimelineProfileConfig profile_config,
                       TimelineProfileFromFlags(job->world_size));
  if (profile_config.enabled && progress.iteration > profile_config.start &&
      log) {
    LOG(WARNING) << "--profile: the run resumes at iteration "
                 << progress.iteration << ", after --profile-step-start "
                 << profile_config.start << "; nothing will be profiled";
  }
  TimelineProfile profile(profile_config, job->rank,
                          [&job] { return job->Barrier(); });
  if (job->state != nullptr) {
    // The first role wins where groups coincide.
    const std::pair<const char*, comm::ProcessGroup*> roles[] = {
        {"tp", job->state->tensor()},   {"pp", job->state->pipeline()},
        {"dp", job->state->data()},     {"embedding", job->state->embedding()},
        {"model", job->state->model()}, {"world", job->state->world()}};
    for (const auto& [label, group] : roles) {
      if (group != nullptr) profile.LabelGroup(group->name(), label);
    }
  }
  for (int64_t iteration = progress.iteration + 1; iteration <= train_iters;
       ++iteration) {
    MCC_RETURN_IF_ERROR(profile.BeforeStep(iteration));
    // The whole iteration on the timeline (nothing when not profiling).
    std::optional<observability::TraceScope> iteration_trace;
    iteration_trace.emplace("iteration", "step");
    if (iteration_trace->active()) {
      iteration_trace->set_name(absl::StrCat("iteration ", iteration));
    }
    if (hash_interval > 0 && iteration % hash_interval == 0) {
      MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
      MCC_RETURN_IF_ERROR(ddp->GatherFullParams());
      const std::vector<data_parallel::ReplicaGroup> groups =
          data_parallel::ReplicaGroupsOf(job->model->parameters(),
                                         replica_sources);
      MCC_RETURN_IF_ERROR(
          data_parallel::CheckWeightHashAcrossReplicaGroups(groups));
      MCC_RETURN_IF_ERROR(ddp->ReleaseFullParams());
      if (log && !groups.empty()) {
        std::vector<std::string> checked;
        for (const auto& g : groups) {
          checked.push_back(absl::StrCat(g.kind, " (", g.group->size(), ")"));
        }
        LOG(INFO) << "iteration " << iteration << ": weights identical across "
                  << absl::StrJoin(checked, ", ") << " replicas";
      }
    }
    std::vector<gpt::MicroBatch> batches;
    timers.Start("data");
    {
      observability::TraceScope trace("data loading", "data");
      for (int m = 0; m < batching.num_microbatches; ++m) {
        MCC_ASSIGN_OR_RETURN(data::MicroBatch mb, train_loader->Next());
        batches.push_back({mb.tokens, mb.labels, mb.loss_mask});
      }
    }
    timers.Stop("data");
    // (Staged to the device; under --cuda-graph the graphed stage adopts
    // them from the model.)
    MCC_RETURN_IF_ERROR(job->model->SetMicroBatches(std::move(batches)));
    ChaosSlowStep();
    rng_calls_before_step = job->model->rng_calls();
    MCC_ASSIGN_OR_RETURN(training::StepMetrics step,
                         trainer->Step(batching.num_microbatches, iteration));
    if (rerun_check.has_value()) {
      if (step.rerun) {
        // Bits, not values: a NaN read twice reproduces.
        auto same = [](double a, double b) {
          return std::memcmp(&a, &b, sizeof(double)) == 0;
        };
        const double rerun_loss =
            rerun_check->SeenLoss(iteration, step.loss, true);
        const bool reproduced = same(rerun_loss, first_seen_loss) &&
                                same(step.grad_norm, first_seen_grad_norm);
        if (log) {
          LOG(WARNING) << absl::StrFormat(
              "iteration %d: %s; rerun from the same state: loss %.17g, "
              "gradient norm %.17g (first run %.17g, %.17g): %s",
              iteration, rerun_suspicion, rerun_loss, step.grad_norm,
              first_seen_loss, first_seen_grad_norm,
              reproduced ? "reproduced, so the data or the model caused it "
                           "(the result stands)"
                         : "not reproduced, a transient fault of the "
                           "machine (training goes on with the rerun's "
                           "result)");
        }
      }
      rerun_check->Accept(step.loss, step.grad_norm);
    }
    if (straggler.has_value()) {
      if (iteration == progress.iteration + 1) {
        straggler->StartWindow();  // After the first step's one-time costs.
        straggler_steps = 0;
      } else {
        ++straggler_steps;
      }
    }
    timers.Add("forward-backward", step.forward_backward_seconds);
    timers.Add("grad-sync", step.grad_sync_seconds);
    timers.Add("optimizer", step.optimizer_seconds);
    pipeline_window.forward_seconds += step.pipeline.forward_seconds;
    pipeline_window.backward_seconds += step.pipeline.backward_seconds;
    pipeline_window.wait_seconds += step.pipeline.wait_seconds;
    pipeline_window.total_seconds += step.pipeline.total_seconds;
    pipeline_window.max_in_flight =
        std::max(pipeline_window.max_in_flight, step.pipeline.max_in_flight);
    pipeline_window.theoretical_bubble = step.pipeline.theoretical_bubble;
    if (step.skipped) {
      ++skipped;
      if (log) {
        LOG(WARNING) << "iteration " << iteration
                     << ": inf or NaN in the gradients, step skipped (loss "
                        "scale now "
                     << optimizer->loss_scale() << ")";
      }
    }
    const double loss = step.loss;
    MCC_RETURN_IF_ERROR(CheckForNan(*job, *optimizer, step));
    window_loss += loss;
    ++window_steps;
    if (tensorboard.enabled() && iteration % tb_interval == 0) {
      MCC_RETURN_IF_ERROR(tensorboard.Add("lm loss", loss, iteration));
      MCC_RETURN_IF_ERROR(tensorboard.Add("learning-rate", step.lr, iteration));
      MCC_RETURN_IF_ERROR(
          tensorboard.Add("grad-norm", step.grad_norm, iteration));
      MCC_RETURN_IF_ERROR(
          tensorboard.Add("loss-scale", step.loss_scale, iteration));
      MCC_RETURN_IF_ERROR(tensorboard.Add(
          "batch-size", static_cast<double>(batching.global_batch), iteration));
      const double step_seconds = step.forward_backward_seconds +
                                  step.grad_sync_seconds +
                                  step.optimizer_seconds;
      if (step_seconds > 0) {
        MCC_RETURN_IF_ERROR(
            tensorboard.Add("iteration-time", step_seconds, iteration));
        MCC_RETURN_IF_ERROR(tensorboard.Add(
            "tokens-per-second", batching.global_batch * seq / step_seconds,
            iteration));
        MCC_RETURN_IF_ERROR(tensorboard.Add(
            "throughput", flops_per_iteration / step_seconds / 1e12,
            iteration));
        if (peak_flops > 0) {
          MCC_RETURN_IF_ERROR(tensorboard.Add(
              "mfu", flops_per_iteration / step_seconds / peak_flops,
              iteration));
        }
      }
      if (absl::GetFlag(FLAGS_log_timers_to_tensorboard)) {
        MCC_RETURN_IF_ERROR(tensorboard.Add(
            "forward-backward-time", step.forward_backward_seconds, iteration));
        MCC_RETURN_IF_ERROR(tensorboard.Add("grad-sync-time",
                                            step.grad_sync_seconds, iteration));
        MCC_RETURN_IF_ERROR(tensorboard.Add("optimizer-time",
                                            step.optimizer_seconds, iteration));
      }
      if (absl::GetFlag(FLAGS_log_memory_to_tensorboard)) {
        const MemoryStats mem = GetAllocator(job->context.device)->Stats();
        MCC_RETURN_IF_ERROR(
            tensorboard.Add("mem-allocated-bytes",
                            static_cast<double>(mem.current_bytes), iteration));
        MCC_RETURN_IF_ERROR(tensorboard.Add("mem-max-allocated-bytes",
                                            static_cast<double>(mem.peak_bytes),
                                            iteration));
      }
      MCC_RETURN_IF_ERROR(tensorboard.Flush());
    }
    if (is_log_iteration(iteration)) {
      const absl::Time now = absl::Now();
      const double seconds =
          absl::ToDoubleSeconds(now - window_start) / window_steps;
      IterationMetrics m;
      m.iteration = iteration;
      m.train_iters = train_iters;
      m.consumed_samples = iteration * batching.global_batch;
      m.loss = window_loss / window_steps;
      m.lr = step.lr;
      m.grad_norm = step.grad_norm;
      m.loss_scale = step.loss_scale;
      m.skipped = skipped;
      m.seconds_per_iteration = seconds;
      m.tokens_per_sec = batching.global_batch * seq / seconds;
      m.tflops = flops_per_iteration / seconds / 1e12;
      m.mfu = peak_flops > 0 ? flops_per_iteration / seconds / peak_flops : 0;
      if (m.mfu > 1.0 && !warned_mfu_above_peak) {
        warned_mfu_above_peak = true;
        const bool given = absl::GetFlag(FLAGS_peak_tflops) > 0;
        LOG(WARNING) << absl::StrFormat(
            "MFU above 100%%: training reached %.1f GFLOP/s, more than %s "
            "%.1f GFLOP/s; %s",
            m.tflops * 1e3,
            given ? "--peak-tflops" : "the GEMM peak measured at start,",
            peak_flops / 1e9,
            given ? "check the flag"
                  : "the machine was likely busy then: pass --peak-tflops "
                    "for a fixed reference");
      }
      const MemoryStats mem = GetAllocator(job->context.device)->Stats();
      m.mem_current_bytes = mem.current_bytes;
      m.mem_peak_bytes = mem.peak_bytes;
      m.num_zeros = step.num_zeros;
      if (absl::GetFlag(FLAGS_log_params_norm)) {
        // Collective over the model and shard groups: every rank logs here.
        MCC_ASSIGN_OR_RETURN(m.params_norm, optimizer->ParamsNorm());
      }
      m.eta_seconds = seconds * (train_iters - iteration);
      logger.Log(m,
                 absl::GetFlag(FLAGS_timing_log_level) > 0 ? &timers : nullptr);
      if (log && !layer_grad_norms.empty()) {
        LOG(INFO) << FormatLayerGradNorms(layer_grad_norms);
      }
      layer_grad_norms.clear();
      // The window of the run's first step holds its one-time costs (lazy
      // connections wait on the slowest peer outside any collective), so it
      // is not reported. Every rank skips alike.
      if (straggler.has_value() && straggler_steps > 0) {
        // Collective over the world: every rank reaches it at this step.
        MCC_ASSIGN_OR_RETURN(training::StragglerReport report,
                             straggler->EndWindow(straggler_steps));
        if (log) {
          LOG(INFO) << "iteration " << iteration << ": "
                    << report.Format(
                           absl::GetFlag(FLAGS_straggler_minmax_count));
        }
      }
      if (profile_ops) {
        if (log) LogOpProfile(window_steps, seconds * window_steps);
        OpProfile::Reset();
      }
      if (straggler.has_value()) {
        straggler->StartWindow();
        straggler_steps = 0;
      }
      MCC_RETURN_IF_ERROR(
          LogPipelineStats(*job, pipeline_window, schedule_name));
      pipeline_window = pipeline::PipelineStats();
      timers.Reset();
      window_start = now;
      window_loss = 0;
      window_steps = 0;
    }
    MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
    if (datasets[1] != nullptr && eval_iters > 0 &&
        iteration % eval_interval == 0) {
      observability::TraceScope trace("evaluation", "eval");
      // The same validation micro-batches every time, so values compare.
      MCC_ASSIGN_OR_RETURN(
          auto valid_loader,
          data::DataLoader::Create(datasets[1], eval_loader_config));
      MCC_ASSIGN_OR_RETURN(
          double vloss,
          Evaluate(*job, trainer.get(), valid_loader.get(), eval_iters));
      if (log) {
        LOG(INFO) << absl::StrFormat(
            "validation loss at iteration %d: %.4f | perplexity %.2f",
            iteration, vloss, std::exp(std::min(vloss, 20.0)));
      }
      MCC_RETURN_IF_ERROR(
          tensorboard.Add("lm loss validation", vloss, iteration));
      MCC_RETURN_IF_ERROR(tensorboard.Add("lm loss validation ppl",
                                          std::exp(std::min(vloss, 20.0)),
                                          iteration));
      MCC_RETURN_IF_ERROR(tensorboard.Flush());
    }
    const bool save_due = ckpt.ShouldSave(iteration, train_iters);
    if (save_due) MCC_RETURN_IF_ERROR(save_checkpoint(iteration));
    iteration_trace.reset();
    MCC_RETURN_IF_ERROR(profile.AfterStep(iteration));
    ChaosKillAfterIteration(iteration);
    MCC_ASSIGN_OR_RETURN(training::ExitReason exit_reason,
                         exit_conditions->After(iteration));
    if (exit_reason != training::ExitReason::kNone) {
      // Megatron's order: save (unless this step just did), then exit 0.
      if (!save_due && !ckpt.save.empty()) {
        MCC_RETURN_IF_ERROR(save_checkpoint(iteration));
      }
      if (log) {
        LOG(INFO) << "stopping after iteration " << iteration << " of "
                  << train_iters << ": "
                  << training::DescribeExitReason(exit_reason, exit_options)
                  << (ckpt.save.empty()
                          ? "; no --save, so nothing was saved"
                          : absl::StrCat("; resume with --load ", ckpt.save));
      }
      stopped_early = true;
      break;
    }
  }
  MCC_RETURN_IF_ERROR(profile.Finish());
  MCC_RETURN_IF_ERROR(SaveFailure(async_saver.Wait(), ckpt));
  if (stopped_early) return job->Barrier();
  // The test split, once, at the end.
  if (datasets[2] != nullptr && eval_iters > 0) {
    MCC_ASSIGN_OR_RETURN(
        auto test_loader,
        data::DataLoader::Create(datasets[2], eval_loader_config));
    MCC_ASSIGN_OR_RETURN(double tloss, Evaluate(*job, trainer.get(),
                                                test_loader.get(), eval_iters));
    if (log) {
      LOG(INFO) << absl::StrFormat("test loss: %.4f | perplexity %.2f", tloss,
                                   std::exp(std::min(tloss, 20.0)));
    }
  }
  if (log && graphed != nullptr) {
    const gpt::GraphedStageStats& g = graphed->stats();
    LOG(INFO) << absl::StrFormat(
        "cuda graph: %d micro-batches replayed, %d captured, %d eager "
        "(warm-up, other shapes), %d re-run after a loss-scale change",
        g.replays, g.captures, g.eager_microbatches, g.rescaled);
  }
  if (log) {
    LogBf16GemmChoices();
    LOG(INFO) << absl::StrFormat("trained %d iterations in %.1f s", train_iters,
                                 absl::ToDoubleSeconds(absl::Now() - start));
  }
  return job->Barrier();
}

}  // namespace

void DescribeDefaultRun() {
  const std::string dir = DefaultRunDir();
  const std::string metrics = absl::GetFlag(FLAGS_metrics_file);
  const std::string png = dir + "/loss.png";
  // The loss curve, through Debian's matplotlib, when it is installed.
  const std::string plot =
      absl::StrCat("/usr/bin/python3 tools/plot_loss.py '", metrics, "' '", png,
                   "' > /dev/null 2>&1");
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string in_workspace =
      workspace != nullptr ? absl::StrCat("cd '", workspace, "' && ") : "";
  const bool plotted = std::system((in_workspace + plot).c_str()) == 0;
  std::printf(
      "\nDefault run done.\n"
      "  checkpoint:   %s (latest iteration in "
      "latest_checkpointed_iteration.txt)\n"
      "  metrics:      %s\n"
      "  loss curve:   %s\n"
      "Generate text from it:\n"
      "  tools/bazel run //:eval -- --load %s --prompt 'The meaning of life'\n",
      absl::GetFlag(FLAGS_save).c_str(), metrics.c_str(),
      plotted ? png.c_str() : "(needs python3-matplotlib)",
      absl::GetFlag(FLAGS_save).c_str());
}

}  // namespace tools
}  // namespace mcc

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  auto parsed =
      mcc::flags::ParseMegatronArgs(argc, argv, {"data_path", "profile_ranks"});
  if (!parsed.ok()) {
    std::fprintf(stderr, "train: %s\n",
                 std::string(parsed.status().message()).c_str());
    return mcc::tools::kFlagError;
  }
  for (const std::string& arg : parsed->positional) {
    if (arg == "help" || arg == "-h") {
      std::printf("usage: train [--flag value ...]\n%s\n",
                  mcc::flags::Usage().c_str());
      return 0;
    }
  }
  if (!parsed->positional.empty()) {
    std::fprintf(stderr, "train: unexpected argument '%s'\n",
                 parsed->positional[0].c_str());
    return mcc::tools::kFlagError;
  }
  absl::Status status;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    status = mcc::flags::ApplyConfigFile(absl::GetFlag(FLAGS_config),
                                         mcc::tools::TrainConfig(),
                                         parsed->explicitly_set);
  }
  if (status.ok()) status = mcc::tools::ApplyPreset(parsed->explicitly_set);
  // No flags at all: the default run keeps its files under runs/default.
  const bool default_run =
      parsed->explicitly_set.empty() && absl::GetFlag(FLAGS_config).empty();
  if (default_run) {
    const std::string dir = mcc::tools::DefaultRunDir();
    absl::SetFlag(&FLAGS_save, dir + "/checkpoints");
    absl::SetFlag(&FLAGS_metrics_file, dir + "/metrics.jsonl");
    std::remove((dir + "/metrics.jsonl").c_str());
  }
  const int world_size = mcc::tools::WorldSizeFromEnvironment();
  if (status.ok()) status = mcc::tools::CheckTrainFlags(world_size);
  if (status.ok()) {
    status = mcc::flags::RefuseUnusedFlags(mcc::tools::RefusedFlags(),
                                           parsed->explicitly_set);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "train: %s\n", std::string(status.message()).c_str());
    return mcc::tools::kFlagError;
  }
  if (mcc::tools::IsFirstRank()) {
    for (const std::string& line : mcc::flags::UnusedFlagWarnings(
             mcc::tools::IgnoredFlags(world_size), parsed->explicitly_set)) {
      LOG(WARNING) << line;
    }
  }
  if (absl::GetFlag(FLAGS_dry_run)) {
    if (!mcc::tools::IsFirstRank()) return 0;
    return mcc::tools::DryRun(mcc::tools::DryRunSettings(world_size),
                              world_size);
  }
  // --load must hold a checkpoint unless it is also --save (auto-resume).
  if (auto r = mcc::ShouldResume(absl::GetFlag(FLAGS_load),
                                 absl::GetFlag(FLAGS_save), false);
      !r.ok()) {
    std::fprintf(stderr, "train: %s\n",
                 std::string(r.status().message()).c_str());
    return absl::IsNotFound(r.status()) ? mcc::tools::kFlagError : 1;
  }
  // --exit-duration-in-mins counts from here, as Megatron's from its start;
  // SIGTERM is caught from here on.
  absl::StatusOr<mcc::training::ExitOptions> exit_options =
      mcc::tools::ExitOptionsFromFlags();
  absl::StatusOr<std::unique_ptr<mcc::training::ExitConditions>>
      exit_conditions =
          exit_options.ok()
              ? mcc::training::ExitConditions::Create(*exit_options,
                                                      absl::Now(), nullptr)
              : absl::StatusOr<std::unique_ptr<mcc::training::ExitConditions>>(
                    exit_options.status());
  if (!exit_conditions.ok()) {
    LOG(ERROR) << "train: " << exit_conditions.status();
    return 1;
  }
  mcc::tools::ConfigureThreads();
  status = mcc::tools::Train(exit_conditions->get());
  if (!status.ok()) {
    LOG(ERROR) << "training failed: " << status;
    return 1;
  }
  if (default_run && mcc::tools::WorldSizeFromEnvironment() == 1) {
    mcc::tools::DescribeDefaultRun();
  }
  return 0;
}
