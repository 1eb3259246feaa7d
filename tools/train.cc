// tools/train: trains a GPT with Megatron-LM's flags. With no flags it runs
// the default: a small GPT on the embedded English corpus, a few hundred
// steps, then saves, evaluates and says how to generate from the result.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint_dir.h"
#include "data/tokenizer.h"
#include "glog/logging.h"
#include "parallel/fsdp/sharding_strategy.h"
#include "tools/dry_run.h"
#include "tools/flags/checkpoint_flags.h"
#include "tools/flags/device_flag.h"
#include "tools/flags/local_checkpoint_flags.h"
#include "tools/flags/megatron_args.h"
#include "tools/flags/presets.h"
#include "tools/flags/runtime_flags.h"
#include "tools/flags/train_config_from_flags.h"
#include "tools/flags/training_flags.h"
#include "training/exit_conditions.h"
#include "training/job.h"
#include "training/run.h"
#include "training/run_options.h"
#include "training/train_config.pb.h"

ABSL_DECLARE_FLAG(bool, debug_collectives);

ABSL_FLAG(std::string, config, "",
          "Text-format TrainConfig protobuf; flags given override it.");
ABSL_FLAG(std::string, preset, "",
          "Named settings for unset flags: 'bench' (6 layers, hidden 512, 8 "
          "heads, vocabulary 8192, sequence 512, micro-batch 4, mock data).");
ABSL_FLAG(int32_t, global_batch_size, 0,
          "Samples per step over all DP ranks (0: micro-batch x DP).");
ABSL_FLAG(std::string, rampup_batch_size, "",
          "START INCR SAMPLES: Megatron's batch-size ramp-up. The global "
          "batch starts at START and grows by INCR every SAMPLES / "
          "((--global-batch-size - START) / INCR) consumed samples until it "
          "reaches --global-batch-size; each step runs its size / "
          "(--micro-batch-size x DP) micro-batches, and the learning-rate "
          "schedule counts consumed samples (its iterations are of the "
          "final global batch). Three words as Megatron's "
          "(--rampup-batch-size 32 32 1000) or one with commas "
          "(32,32,1000); empty: none.");
ABSL_FLAG(std::string, pipeline_schedule, "1f1b",
          "Pipeline schedule, a flag of ours (Megatron has no equivalent: it "
          "runs 1F1B, interleaved with --num-layers-per-virtual-pipeline-"
          "stage): 1f1b (interleaved 1F1B with virtual stages), interleaved, "
          "zb-h1 (zero-bubble H1: 1F1B's order and peak memory, each "
          "backward split into input and weight gradients, weight gradients "
          "deferred into the cool-down's idle time) or zbv (zero-bubble V: "
          "two chunks per stage placed in a V, so stage 0 holds the "
          "embeddings and the loss; needs --num-layers-per-virtual-pipeline-"
          "stage = --num-layers / (2 x --pipeline-model-parallel-size) "
          "and the CPU pipeline group; peak activations "
          "equal 1F1B's).");
ABSL_FLAG(std::string, pipeline_schedule_file, "",
          "A flag of ours (Megatron has no equivalent): a CSV schedule table "
          "to run instead of --pipeline-schedule's, with the header "
          "rank,step,microbatch,chunk,op and one row per operation (op F, B "
          "or W: forward, input gradient, weight gradient). It is checked "
          "before the run: every dependency met, and no rank holding more "
          "activations than 1F1B's busiest (interleaved's with virtual "
          "stages).");
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
          "constant, linear, cosine, inverse-square-root or WSD "
          "(warmup-stable-decay).");
ABSL_FLAG(std::string, lr_wsd_decay_style, "exponential",
          "WSD's annealing curve: exponential, linear, cosine or minus_sqrt.");
ABSL_FLAG(int64_t, lr_wsd_decay_iters, 0,
          "WSD: the last iterations of --lr-decay-iters that anneal to "
          "--min-lr (required with --lr-decay-style WSD).");
ABSL_FLAG(double, weight_decay, 0.01, "Decoupled weight decay.");
ABSL_FLAG(bool, sft, false,
          "Supervised fine-tuning data: each --data-path prefix has a loss "
          "mask beside it (preprocess_data --sft writes both), and the loss "
          "covers only the tokens it marks (the assistant's).");
ABSL_FLAG(bool, finetune, false,
          "Load only the model weights from --load: the iteration, consumed "
          "samples, optimizer state and RNG start afresh (Megatron's "
          "--finetune).");
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
ABSL_FLAG(std::string, fp8_format, "",
          "FP8 GEMMs in the transformer layers' linear layers: e4m3 (every "
          "tensor E4M3) or hybrid (E4M3 forward, E5M2 gradients); empty: "
          "none. Master weights, optimizer and reductions are unchanged; "
          "emulated on the CPU.");
ABSL_FLAG(std::string, fp8_recipe, "delayed",
          "With --fp8-format: delayed (scales from an amax history) or "
          "tensorwise (each cast from its own amax).");
ABSL_FLAG(int32_t, fp8_margin, 0,
          "With --fp8-recipe delayed: scales are divided by 2^margin.");
ABSL_FLAG(int32_t, fp8_amax_history_len, 1,
          "With --fp8-recipe delayed: amaxes kept per tensor.");
ABSL_FLAG(std::string, fp8_amax_compute_algo, "most_recent",
          "With --fp8-recipe delayed: max or most_recent of the history.");
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
ABSL_FLAG(bool, use_precision_aware_optimizer, false,
          "Store Adam's moments (and the main parameters of 16-bit weights) "
          "in --exp-avg-dtype, --exp-avg-sq-dtype and --main-params-dtype: "
          "each update computes in fp32 and rounds to nearest. Needs the "
          "distributed optimizer, as Megatron's.");
ABSL_FLAG(std::string, main_params_dtype, "fp32",
          "fp32 or fp16: the main copy of 16-bit weights "
          "(--use-precision-aware-optimizer).");
ABSL_FLAG(std::string, exp_avg_dtype, "fp32",
          "fp32, bf16 or fp16: Adam's first moment "
          "(--use-precision-aware-optimizer).");
ABSL_FLAG(std::string, exp_avg_sq_dtype, "fp32",
          "fp32, bf16 or fp16: Adam's second moment "
          "(--use-precision-aware-optimizer).");
ABSL_FLAG(int32_t, num_distributed_optimizer_instances, 1,
          "HSDP: shard optimizer state (and, with optim_grads_params, "
          "parameters) within N instances of contiguous data-parallel ranks "
          "and replicate it across them; gradients reduce-scattered within an "
          "instance and all-reduced across. Needs sharded state.");
ABSL_FLAG(bool, optimizer_cpu_offload, false,
          "Megatron's optimizer offload: a share of the fp32 main weights "
          "and Adam state lives in pinned host memory, stepped by the CPU "
          "kernels beside the device's share, weights copied back on a side "
          "stream. For --device cuda (refused on the CPU device, where the "
          "state is in host memory already).");
ABSL_FLAG(double, optimizer_offload_fraction, 1.0,
          "The share (0, 1] of the optimizer's elements --optimizer-cpu-"
          "offload keeps on the host, whole parameters in order; refused "
          "without it.");
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

// Settings a preset gives to flags the user did not set.
absl::Status ApplyPreset(const std::set<std::string>& explicitly_set) {
  return flags::ApplyPreset(absl::GetFlag(FLAGS_preset), explicitly_set);
}

// The step as the planner sees it (train --dry-run); flags are checked.
TrainSettings DryRunSettings(const training::TrainConfig& config,
                             int world_size) {
  const int model_parallel = config.tensor_model_parallel_size() *
                             config.pipeline_model_parallel_size() *
                             config.context_parallel_size();
  TrainSettings s;
  s.global_batch =
      training::PlanBatches(config, world_size / model_parallel)->global_batch;
  const fsdp::ShardingStrategy strategy =
      fsdp::ParseShardingStrategy(config.data_parallel_sharding_strategy())
          .value_or(fsdp::ShardingStrategy::kNoShard);
  switch (strategy) {
    case fsdp::ShardingStrategy::kNoShard:
      s.zero = config.use_distributed_optimizer()
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
  s.adam = config.optimizer() != "sgd";
  s.overlap_grad_reduce = config.overlap_grad_reduce();
  s.overlap_param_gather = config.overlap_param_gather();
  s.overlap_p2p = !config.no_overlap_p2p_communication();
  s.bucket_bytes = config.ddp_bucket_size() * 4;
  // Checked with the other flags before the dry run.
  const int microbatches = static_cast<int>(
      training::PlanBatches(config, world_size / model_parallel)
          ->num_microbatches);
  ReadPrecisionAndScheduleFile(config, microbatches, &s).IgnoreError();
  return s;
}

// --dry-run plans expert parallelism the GPT cannot run yet (beside TP or
// ZeRO-2/3, which train refuses; at TP 1 train runs it too): the expert
// sizes are checked on their own (divisibility) and the rest of the config
// as train would check it. Other runs are checked as they are.
training::TrainConfig WithoutExpertParallelism(
    const training::TrainConfig& config, int world_size) {
  if (!config.dry_run() || config.num_experts() == 0 ||
      !training::CheckExpertParallelOptions(config, config.num_experts(),
                                            world_size)
           .ok()) {
    return config;
  }
  training::TrainConfig checked = config;
  checked.set_expert_model_parallel_size(1);
  if (checked.expert_tensor_parallel_size() > 1) {
    checked.set_expert_tensor_parallel_size(1);
  }
  return checked;
}

// Flags this run never reads, refused before any process group forms.
std::vector<flags::UnusedFlag> RefusedFlags(
    const training::TrainConfig& config) {
  // As --save-interval and --async-save, which need --save DIR too.
  const bool no_save = config.save().empty();
  const bool no_load = config.load().empty();
  return {
      {"accumulate_allreduce_grads_in_fp32",
       !config.accumulate_allreduce_grads_in_fp32(),
       "gradients always accumulate and reduce in fp32 here (fp32 main "
       "gradients for every dtype); turning that off is not built"},
      {"keep_last", no_save, "it needs --save DIR"},
      {"no_load_optim", no_load, "it needs --load DIR"},
      {"no_load_rng", no_load, "it needs --load DIR"},
      {"finetune", no_load, "it needs --load DIR"},
      // Under --device auto the model builder refuses it once the CPU is
      // chosen (ActivationOffloader::Create).
      {"cpu_offloading", config.device() == "cpu",
       "the model is on the CPU, where activations already live in host "
       "memory: there is nothing to offload (it needs --device cuda)"},
      // Under --device auto, GraphedStage::Create refuses the CPU.
      {"cuda_graph", config.device() == "cpu",
       "the CPU runs kernels as they are called: there is no device work "
       "to capture (it needs --device cuda)"},
  };
}

// Flags that matter only in other modes: each given one warns once.
std::vector<flags::UnusedFlag> IgnoredFlags(const training::TrainConfig& config,
                                            int world_size) {
  const int tp = config.tensor_model_parallel_size();
  const int pp = config.pipeline_model_parallel_size();
  const int dp = world_size / std::max(1, tp * pp);
  const bool mock = config.mock_data();
  const bool fp16 = config.fp16();
  const bool sgd = config.optimizer() == "sgd";
  // CheckTrainFlags has parsed the strategy already.
  const fsdp::ShardingStrategy strategy =
      fsdp::ParseShardingStrategy(config.data_parallel_sharding_strategy())
          .value_or(fsdp::ShardingStrategy::kNoShard);
  const bool per_unit_shards = fsdp::ShardsGradients(strategy);
  const bool distributed_optimizer = config.use_distributed_optimizer() ||
                                     strategy == fsdp::ShardingStrategy::kOptim;
  const std::string decay = config.lr_decay_style();
  const std::string no_dp = "the data-parallel size is 1";
  // No parameter has a replica on another rank to compare with.
  const bool no_replicas =
      dp == 1 && tp == 1 && config.context_parallel_size() == 1 &&
      (pp == 1 || config.untie_embeddings_and_output_weights());
  const std::string no_replicas_why =
      "no parameter is replicated on another rank (DP, TP and CP are 1 and "
      "no tied embedding spans pipeline stages)";
  const std::string loss_scaling = "loss scaling is fp16's (give --fp16)";
  const bool rerun = config.rerun_mode() == "validate_results";
  const std::string no_rerun = "only --rerun-mode validate_results reads it";
  const bool no_fp8 = config.fp8_format().empty();
  const bool delayed_fp8 = !no_fp8 && config.fp8_recipe() == "delayed";
  const std::string mock_why =
      "--mock-data draws tokens uniformly below --vocab-size; no files or "
      "tokenizer are read";
  const std::string per_unit =
      absl::StrCat("--data-parallel-sharding-strategy ",
                   fsdp::ShardingStrategyName(strategy),
                   " reduces each layer's gradients as its backward ends");
  const bool no_tensorboard = config.tensorboard_dir().empty();
  const std::string tb_why = "it needs --tensorboard-dir";
  const bool no_profile = !config.profile();
  const std::string profile_why = "it needs --profile";
  const bool dense = config.num_experts() == 0;
  const std::string no_experts = "it needs --num-experts (a dense model)";
  return {
      {"expert_tensor_parallel_size", dense, no_experts},
      {"moe_pack_expert_weights", dense, no_experts},
      {"moe_token_drop_policy", config.moe_expert_capacity_factor() <= 0,
       "it needs --moe-expert-capacity-factor (a dropless run drops "
       "nothing)"},
      {"profile_step_start", no_profile, profile_why},
      {"profile_step_end", no_profile, profile_why},
      {"profile_ranks", no_profile, profile_why},
      {"profile_dir", no_profile, profile_why},
      {"tensorboard_log_interval", no_tensorboard, tb_why},
      {"log_timers_to_tensorboard", no_tensorboard, tb_why},
      {"log_memory_to_tensorboard", no_tensorboard, tb_why},
      {"num_query_groups", !config.group_query_attention(),
       "it needs --group-query-attention"},
      {"add_qkv_bias", !config.disable_bias_linear(),
       "every linear layer has a bias (it matters with "
       "--disable-bias-linear)"},
      {"rotary_base", config.position_embedding_type() != "rope",
       "it needs --position-embedding-type rope"},
      {"rope_scaling_factor", !config.use_rope_scaling(),
       "it needs --use-rope-scaling"},
      {"rope_scaling_low_freq_factor", !config.use_rope_scaling(),
       "it needs --use-rope-scaling"},
      {"rope_scaling_high_freq_factor", !config.use_rope_scaling(),
       "it needs --use-rope-scaling"},
      {"rope_scaling_original_max_position_embeddings",
       !config.use_rope_scaling(), "it needs --use-rope-scaling"},
      {"recompute_method", config.recompute_granularity() != "full",
       "it needs --recompute-granularity full"},
      {"recompute_num_layers", config.recompute_granularity() != "full",
       "it needs --recompute-granularity full"},
      {"cpu_offloading_num_layers", !config.cpu_offloading(),
       "it needs --cpu-offloading"},
      {"cp_comm_type", config.context_parallel_size() == 1,
       "it needs --context-parallel-size > 1"},
      {"sequence_parallel", tp == 1,
       "it splits activations over tensor-parallel ranks "
       "(--tensor-model-parallel-size 1)"},
      {"no_overlap_p2p_communication", pp == 1,
       "only pipeline transfers overlap (--pipeline-model-parallel-size 1)"},
      {"pipeline_schedule", pp == 1,
       "one stage runs no pipeline schedule (--pipeline-model-parallel-size "
       "1)"},
      {"pipeline_schedule_file", pp == 1,
       "one stage runs no pipeline schedule (--pipeline-model-parallel-size "
       "1)"},
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
       !mock && !data::TokenizerReadsFlag(config.tokenizer_type(),
                                          "tokenizer_model"),
       "only SentencePieceTokenizer and HuggingFaceTokenizer read it"},
      {"data_cache_path", mock, mock_why},
      {"eod_mask_loss", mock, mock_why},
      {"reset_attention_mask", mock, mock_why},
      {"reset_position_ids", mock, mock_why},
      {"reset_position_ids",
       !mock && config.position_embedding_type() == "rope",
       "rotary positions stay the sequence's (a shift common to a document "
       "changes none of its attention scores); only learned positions read "
       "it"},
      {"sft", mock, mock_why},
      {"vocab_file", !mock && config.tokenizer_type() != "GPT2BPETokenizer",
       "only GPT2BPETokenizer reads it"},
      {"merge_file", !mock && config.tokenizer_type() != "GPT2BPETokenizer",
       "only GPT2BPETokenizer reads it"},
      {"eval_interval", config.eval_iters() == 0,
       "--eval-iters 0 turns evaluation off"},
      {"lr_warmup_iters", config.lr_warmup_fraction() >= 0,
       "--lr-warmup-fraction sets the warmup"},
      {"min_lr", decay == "constant", "--lr-decay-style constant"},
      {"lr_wsd_decay_style", decay != "WSD", "only --lr-decay-style WSD"},
      {"lr_wsd_decay_iters", decay != "WSD", "only --lr-decay-style WSD"},
      {"lr_decay_iters",
       (decay == "constant" || decay == "inverse-square-root") &&
           config.lr_warmup_fraction() < 0,
       "--lr-decay-style " + decay + " has no decay length"},
      {"adam_beta1", sgd, "--optimizer sgd"},
      {"adam_beta2", sgd, "--optimizer sgd"},
      {"adam_eps", sgd, "--optimizer sgd"},
      {"sgd_momentum", !sgd, "--optimizer adam"},
      {"loss_scale", !fp16, loss_scaling},
      {"initial_loss_scale", !fp16 || config.loss_scale() > 0,
       fp16 ? "--loss-scale sets a static scale" : loss_scaling},
      {"min_loss_scale", !fp16 || config.loss_scale() > 0,
       fp16 ? "--loss-scale sets a static scale" : loss_scaling},
      {"loss_scale_window", !fp16 || config.loss_scale() > 0,
       fp16 ? "--loss-scale sets a static scale" : loss_scaling},
      {"hysteresis", !fp16 || config.loss_scale() > 0,
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
       !rerun ||
           (!config.check_for_spiky_loss() && !config.check_for_large_grads()),
       "only --check-for-spiky-loss and --check-for-large-grads under "
       "--rerun-mode validate_results read it"},
      {"error_injection_rate", !rerun, no_rerun},
      {"error_injection_type", !rerun || config.error_injection_rate() == 0,
       "errors are injected only with --error-injection-rate under "
       "--rerun-mode validate_results"},
      {"straggler_minmax_count", !config.log_straggler(),
       "only --log-straggler lists ranks"},
      {"straggler_threshold", !config.log_straggler(),
       "only --log-straggler names stragglers"},
      {"moe_router_topk", dense, no_experts},
      {"moe_ffn_hidden_size", dense, no_experts},
      {"moe_layer_freq", dense, no_experts},
      {"moe_shared_expert_intermediate_size", dense, no_experts},
      {"moe_router_score_function", dense, no_experts},
      {"moe_shared_expert_gate",
       dense || config.moe_shared_expert_intermediate_size() == 0,
       dense ? no_experts
             : "it needs --moe-shared-expert-intermediate-size (a shared "
               "expert to gate)"},
      {"moe_router_pre_softmax",
       dense || config.moe_router_score_function() != "softmax",
       dense ? no_experts
             : "sigmoid scores are renormalised over the top-k whatever it "
               "says (Megatron's)"},
      {"moe_router_load_balancing_type", dense, no_experts},
      {"moe_aux_loss_coeff", dense, no_experts},
      {"moe_aux_loss_coeff",
       !dense && config.moe_router_load_balancing_type() == "none",
       "--moe-router-load-balancing-type none computes no balancing loss"},
      {"moe_z_loss_coeff", dense, no_experts},
      {"moe_router_enable_expert_bias", dense, no_experts},
      {"moe_router_bias_update_rate",
       dense || !config.moe_router_enable_expert_bias(),
       "it needs --moe-router-enable-expert-bias"},
      {"moe_grouped_gemm", true,
       "the experts always run as grouped GEMMs here "
       "(core/ops/grouped_gemm.h)"},
      {"moe_router_dtype", true, "the router always computes in fp32 here"},
      {"moe_token_dispatcher_type", config.expert_model_parallel_size() <= 1,
       "without expert parallelism (--expert-model-parallel-size 1) every "
       "token stays on its rank, and allgather and alltoall are the same "
       "local permutation"},
      {"fp8_recipe", no_fp8, "it needs --fp8-format"},
      {"fp8_margin", !delayed_fp8,
       no_fp8 ? "it needs --fp8-format" : "only --fp8-recipe delayed reads it"},
      {"fp8_amax_history_len", !delayed_fp8,
       no_fp8 ? "it needs --fp8-format" : "only --fp8-recipe delayed reads it"},
      {"fp8_amax_compute_algo", !delayed_fp8,
       no_fp8 ? "it needs --fp8-format" : "only --fp8-recipe delayed reads it"},
  };
}

}  // namespace

void DescribeDefaultRun() {
  const std::string dir = training::DefaultRunDir();
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
  auto parsed = mcc::flags::ParseMegatronArgs(
      argc, argv, {"data_path", "profile_ranks", "rampup_batch_size"});
  if (!parsed.ok()) {
    std::fprintf(stderr, "train: %s\n",
                 std::string(parsed.status().message()).c_str());
    return mcc::tools::kFlagError;
  }
  mcc::flags::ApplyRuntimeFlags();
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
                                         mcc::training::TrainConfig(),
                                         parsed->explicitly_set);
  }
  if (status.ok()) status = mcc::tools::ApplyPreset(parsed->explicitly_set);
  // No flags at all: the default run keeps its files under runs/default.
  const bool default_run =
      parsed->explicitly_set.empty() && absl::GetFlag(FLAGS_config).empty();
  if (default_run) {
    const std::string dir = mcc::training::DefaultRunDir();
    absl::SetFlag(&FLAGS_save, dir + "/checkpoints");
    absl::SetFlag(&FLAGS_metrics_file, dir + "/metrics.jsonl");
    std::remove((dir + "/metrics.jsonl").c_str());
  }
  // From here on the run is its TrainConfig; the flags only named it.
  absl::StatusOr<mcc::training::TrainConfig> config =
      status.ok() ? mcc::flags::TrainConfigFromFlags()
                  : absl::StatusOr<mcc::training::TrainConfig>(status);
  const int world_size = mcc::training::WorldSizeFromEnvironment();
  if (config.ok()) {
    status = mcc::training::CheckTrainConfig(
        mcc::tools::WithoutExpertParallelism(*config, world_size), world_size);
  } else {
    status = config.status();
  }
  if (status.ok()) {
    status = mcc::flags::RefuseUnusedFlags(mcc::tools::RefusedFlags(*config),
                                           parsed->explicitly_set);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "train: %s\n", std::string(status.message()).c_str());
    return mcc::tools::kFlagError;
  }
  if (mcc::training::IsFirstRank()) {
    for (const std::string& line : mcc::flags::UnusedFlagWarnings(
             mcc::tools::IgnoredFlags(*config, world_size),
             parsed->explicitly_set)) {
      LOG(WARNING) << line;
    }
  }
  if (config->dry_run()) {
    if (!mcc::training::IsFirstRank()) return 0;
    // The probe measures under the OpenMP wait policy the run will use.
    mcc::training::UsePassiveOpenMpWait();
    return mcc::tools::DryRun(
        *config, mcc::tools::DryRunSettings(*config, world_size), world_size);
  }
  // --load must hold a checkpoint unless it is also --save (auto-resume).
  if (auto r = mcc::ShouldResume(config->load(), config->save(), false);
      !r.ok()) {
    std::fprintf(stderr, "train: %s\n",
                 std::string(r.status().message()).c_str());
    return absl::IsNotFound(r.status()) ? mcc::tools::kFlagError : 1;
  }
  // --exit-duration-in-mins counts from here, as Megatron's from its start;
  // SIGTERM is caught from here on.
  absl::StatusOr<mcc::training::ExitOptions> exit_options =
      mcc::training::ExitOptionsFromConfig(*config);
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
  mcc::training::ConfigureThreads(*config);
  status = mcc::training::Run(*config, exit_conditions->get());
  if (!status.ok()) {
    LOG(ERROR) << "training failed: " << status;
    return 1;
  }
  if (default_run && mcc::training::WorldSizeFromEnvironment() == 1) {
    mcc::tools::DescribeDefaultRun();
  }
  return 0;
}
