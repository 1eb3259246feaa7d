#include "training/run_options.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "models/moe/token_drop.h"
#include "parallel/fsdp/sharding_strategy.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/pipeline/schedule_check.h"
#include "parallel/pipeline/schedule_csv.h"
#include "parallel/rank_layout.h"
#include "training/device_choice.h"
#include "training/job.h"
#include "training/model_from_config.h"

namespace mcc {
namespace training {

bool CheckpointOptions::ShouldSave(int64_t iteration,
                                   int64_t train_iters) const {
  if (save.empty()) return false;
  if (iteration == train_iters) return true;
  return save_interval > 0 && iteration % save_interval == 0;
}

absl::StatusOr<CheckpointOptions> CheckpointOptionsFromConfig(
    const TrainConfig& config) {
  CheckpointOptions f;
  f.save = config.save();
  f.save_interval = config.save_interval();
  f.load = config.load();
  f.async_save = config.async_save();
  f.keep_last = config.keep_last();
  f.no_load_rng = config.no_load_rng();
  f.no_load_optim = config.no_load_optim();
  f.finetune = config.finetune();
  f.continue_on_save_failure = config.continue_on_save_failure();
  if (f.save_interval < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--save-interval ", f.save_interval, " is negative"));
  }
  if (f.save_interval > 0 && f.save.empty()) {
    return absl::InvalidArgumentError("--save-interval needs --save DIR");
  }
  if (f.keep_last < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep-last ", f.keep_last, " is negative"));
  }
  if (f.async_save && f.save.empty()) {
    return absl::InvalidArgumentError("--async-save needs --save DIR");
  }
  if (f.continue_on_save_failure && f.save.empty()) {
    return absl::InvalidArgumentError(
        "--continue-on-save-failure needs --save DIR");
  }
  return f;
}

// --profile and its window, checked (errors name the flag).
absl::StatusOr<TimelineProfileConfig> TimelineProfileFromConfig(
    const TrainConfig& config, int world_size) {
  TimelineProfileConfig c;
  c.enabled = config.profile();
  c.start = config.profile_step_start();
  c.end = config.profile_step_end();
  c.dir = config.profile_dir();
  if (!c.enabled) return c;
  MCC_ASSIGN_OR_RETURN(c.ranks,
                       ParseProfileRanks(config.profile_ranks(), world_size));
  MCC_RETURN_IF_ERROR(CheckTimelineProfile(c, config.train_iters()));
  return c;
}

absl::StatusOr<Batching> PlanBatches(const TrainConfig& config, int dp) {
  Batching b;
  const int64_t mbs = config.micro_batch_size();
  b.global_batch =
      config.global_batch_size() > 0 ? config.global_batch_size() : mbs * dp;
  if (b.global_batch % (mbs * dp) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--global-batch-size (", b.global_batch,
                     ") is not divisible by --micro-batch-size (", mbs,
                     ") x data-parallel size (", dp, ")"));
  }
  b.num_microbatches = static_cast<int>(b.global_batch / (mbs * dp));
  return b;
}

absl::StatusOr<MicroBatchCalculator> MicroBatchCalculatorFromConfig(
    const TrainConfig& config, int dp) {
  MCC_ASSIGN_OR_RETURN(Batching final_batch, PlanBatches(config, dp));
  MCC_ASSIGN_OR_RETURN(std::optional<BatchSizeRampup> rampup,
                       ParseRampupBatchSize(config.rampup_batch_size()));
  return MicroBatchCalculator::Create(final_batch.global_batch,
                                      config.micro_batch_size(), dp, rampup);
}

absl::Status CheckBatchRampAhead(const TrainConfig& config,
                                 const MicroBatchCalculator& batches,
                                 int64_t consumed_samples) {
  if (!batches.ramping()) return absl::OkStatus();
  if (!config.pipeline_schedule_file().empty() &&
      config.pipeline_model_parallel_size() > 1) {
    return absl::InvalidArgumentError(
        "--rampup-batch-size cannot be combined with "
        "--pipeline-schedule-file: its table is written for one number of "
        "micro-batches, and the ramp changes it");
  }
  MCC_RETURN_IF_ERROR(batches.CheckDivisibleFrom(consumed_samples));
  MCC_ASSIGN_OR_RETURN(pipeline::PipelineConfig split,
                       PipelineConfigFromConfig(config));
  for (int64_t size = batches.GlobalBatchSize(consumed_samples);
       size < batches.global_batch(); size += batches.rampup()->increment) {
    const absl::Status s = pipeline::ValidateMicroBatches(
        split, static_cast<int>(size / batches.micro_batch_times_dp()));
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rampup-batch-size: at the ramp's global batch size ",
                       size, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<optim::StatePrecision> StatePrecisionFromConfig(
    const TrainConfig& config) {
  optim::StatePrecision p;
  const bool lowered = config.main_params_dtype() != "fp32" ||
                       config.exp_avg_dtype() != "fp32" ||
                       config.exp_avg_sq_dtype() != "fp32";
  if (!config.use_precision_aware_optimizer()) {
    if (lowered) {
      return absl::InvalidArgumentError(
          "--main-params-dtype, --exp-avg-dtype and --exp-avg-sq-dtype take "
          "effect only with --use-precision-aware-optimizer");
    }
    return p;
  }
  // As Megatron: the precision-aware optimizer is the distributed one's.
  MCC_ASSIGN_OR_RETURN(
      fsdp::ShardingStrategy strategy,
      fsdp::ParseShardingStrategy(config.data_parallel_sharding_strategy()));
  if (!config.use_distributed_optimizer() &&
      strategy == fsdp::ShardingStrategy::kNoShard) {
    return absl::InvalidArgumentError(
        "--use-precision-aware-optimizer needs the distributed optimizer "
        "(--use-distributed-optimizer or --data-parallel-sharding-strategy "
        "optim, optim_grads or optim_grads_params), as Megatron's");
  }
  if (config.optimizer() == "sgd") {
    return absl::InvalidArgumentError(
        "--use-precision-aware-optimizer stores Adam's moments: it needs "
        "--optimizer adam");
  }
  MCC_ASSIGN_OR_RETURN(p.main_params,
                       optim::ParseStateDType("--main-params-dtype",
                                              config.main_params_dtype()));
  MCC_ASSIGN_OR_RETURN(
      p.exp_avg,
      optim::ParseStateDType("--exp-avg-dtype", config.exp_avg_dtype()));
  MCC_ASSIGN_OR_RETURN(
      p.exp_avg_sq,
      optim::ParseStateDType("--exp-avg-sq-dtype", config.exp_avg_sq_dtype()));
  if (p.main_params != DType::kFloat32 && !config.bf16() && !config.fp16()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--main-params-dtype ", config.main_params_dtype(),
        " needs 16-bit model weights (--bf16 or --fp16): fp32 weights are "
        "their own main copy"));
  }
  if (p.main_params != DType::kFloat32 && fsdp::ShardsGradients(strategy)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--main-params-dtype ", config.main_params_dtype(),
                     " with --data-parallel-sharding-strategy ",
                     config.data_parallel_sharding_strategy(),
                     ": the fp32 main shards are the wrapper's; lower only "
                     "--exp-avg-dtype and --exp-avg-sq-dtype there"));
  }
  return p;
}

absl::Status CheckOptimizerOffload(const TrainConfig& config) {
  if (!config.optimizer_cpu_offload()) {
    if (config.optimizer_offload_fraction() != 1.0) {
      return absl::InvalidArgumentError(
          "--optimizer-offload-fraction takes effect only with "
          "--optimizer-cpu-offload");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<DeviceChoice> device = ChooseDevice(config.device());
  if (device.ok() && device->device.is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--optimizer-cpu-offload with --device ", config.device(),
        " (the CPU): the optimizer state already lives in host memory, so "
        "offloading it is meaningless"));
  }
  const double fraction = config.optimizer_offload_fraction();
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer-offload-fraction ", fraction,
                     " must lie in (0, 1] (the share of the optimizer's "
                     "state kept in host memory)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<optim::OptimizerConfig> OptimizerConfigFromConfig(
    const TrainConfig& config) {
  optim::OptimizerConfig c;
  const std::string type = config.optimizer();
  if (type == "adam" || type == "adamw") {
    c.type = optim::OptimizerType::kAdam;
  } else if (type == "sgd") {
    c.type = optim::OptimizerType::kSgd;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer: '", type, "' is not adam or sgd"));
  }
  c.weight_decay = config.weight_decay();
  c.adam_beta1 = config.adam_beta1();
  c.adam_beta2 = config.adam_beta2();
  c.adam_eps = config.adam_eps();
  c.sgd_momentum = config.sgd_momentum();
  c.clip_grad = config.clip_grad();
  c.log_num_zeros_in_grad = config.log_num_zeros_in_grad();
  MCC_ASSIGN_OR_RETURN(c.state_precision, StatePrecisionFromConfig(config));
  MCC_RETURN_IF_ERROR(CheckOptimizerOffload(config));
  if (config.optimizer_cpu_offload()) {
    c.cpu_offload_fraction = config.optimizer_offload_fraction();
  }
  c.loss_scaling = config.fp16();
  c.loss_scaler.initial_scale = config.initial_loss_scale();
  c.loss_scaler.min_scale = config.min_loss_scale();
  c.loss_scaler.growth_interval = config.loss_scale_window();
  c.loss_scaler.hysteresis = config.hysteresis();
  c.loss_scaler.static_scale = config.loss_scale();
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

absl::StatusOr<optim::LrSchedule> ScheduleFromConfig(
    const TrainConfig& config) {
  optim::LrScheduleConfig c;
  c.lr = config.lr();
  c.min_lr = std::min(config.min_lr(), c.lr);
  c.warmup_iters = config.lr_warmup_iters();
  c.warmup_fraction = config.lr_warmup_fraction();
  c.decay_iters = config.lr_decay_iters() > 0 ? config.lr_decay_iters()
                                              : config.train_iters();
  MCC_ASSIGN_OR_RETURN(c.decay_style,
                       optim::ParseLrDecayStyle(config.lr_decay_style()));
  c.wsd_decay_iters = config.lr_wsd_decay_iters();
  MCC_ASSIGN_OR_RETURN(c.wsd_decay_style,
                       optim::ParseWsdDecayStyle(config.lr_wsd_decay_style()));
  return optim::LrSchedule::Create(c);
}

absl::StatusOr<ExitOptions> ExitOptionsFromConfig(const TrainConfig& config) {
  ExitOptions options;
  options.on_signal = config.exit_signal_handler();
  const double minutes = config.exit_duration_in_mins();
  if (!(minutes >= 0) || minutes > 365 * 24 * 60) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--exit-duration-in-mins must be 0 (none) or positive and at most a "
        "year, got ",
        minutes));
  }
  if (minutes > 0) options.max_duration = absl::Seconds(minutes * 60);
  options.interval = config.exit_interval();
  if (options.interval < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--exit-interval must be 0 (none) or positive, got ",
                     options.interval));
  }
  return options;
}

absl::StatusOr<std::optional<RerunCheckOptions>> RerunCheckOptionsFromConfig(
    const TrainConfig& config) {
  const std::string mode = config.rerun_mode();
  if (mode != "disabled" && mode != "validate_results") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rerun-mode must be disabled or validate_results, got '", mode, "'",
        mode == "report_stats" ? " (report_stats is not built here)" : ""));
  }
  RerunCheckOptions options;
  options.check_spiky_loss = config.check_for_spiky_loss();
  options.check_large_grads = config.check_for_large_grads();
  options.spike_factor = config.spiky_loss_factor();
  if (!(options.spike_factor > 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--spiky-loss-factor must be above 1, got ", options.spike_factor));
  }
  options.injection_rate = config.error_injection_rate();
  if (options.injection_rate < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--error-injection-rate must be 0 (none) or positive, "
                     "got ",
                     options.injection_rate));
  }
  MCC_ASSIGN_OR_RETURN(options.injection,
                       ParseInjection(config.error_injection_type()));
  if (mode == "disabled") return std::nullopt;
  return options;
}

absl::Status CheckStragglerOptions(const TrainConfig& config) {
  if (config.straggler_minmax_count() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--straggler-minmax-count must be at least 1, got ",
                     config.straggler_minmax_count()));
  }
  if (!(config.straggler_threshold() > 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--straggler-threshold must be above 1, got ",
                     config.straggler_threshold()));
  }
  return absl::OkStatus();
}

absl::Status CheckExpertParallelOptions(const TrainConfig& config,
                                        int64_t num_experts, int world_size) {
  const int ep = config.expert_model_parallel_size();
  const int etp = config.expert_tensor_parallel_size();
  MCC_RETURN_IF_ERROR(
      moe::ParseTokenDropPolicy(config.moe_token_drop_policy()).status());
  if (ep < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-model-parallel-size ", ep, " must be at least 1"));
  }
  if (etp < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--expert-tensor-parallel-size ", etp,
                     " is negative (0: --tensor-model-parallel-size's)"));
  }
  const char* no_moe = " needs MoE layers (--num-experts)";
  if (num_experts == 0) {
    if (ep > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--expert-model-parallel-size ", ep, no_moe));
    }
    if (config.moe_expert_capacity_factor() > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--moe-expert-capacity-factor ",
                       config.moe_expert_capacity_factor(), no_moe));
    }
  } else {
    if (num_experts % ep != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--num-experts ", num_experts,
          " is not a multiple of --expert-model-parallel-size ", ep));
    }
  }
  if (world_size > 0) {
    const int etp_size = etp == 0 ? config.tensor_model_parallel_size() : etp;
    const int expert_model =
        etp_size * ep * config.pipeline_model_parallel_size();
    if (expert_model > 0 && world_size % expert_model != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--expert-tensor-parallel-size (", etp_size,
          etp == 0 ? ", from --tensor-model-parallel-size" : "",
          ") x --expert-model-parallel-size (", ep,
          ") x --pipeline-model-parallel-size (",
          config.pipeline_model_parallel_size(), ") = ", expert_model,
          " does not divide the world size ", world_size));
    }
    parallel::ParallelSizes sizes;
    sizes.tensor = config.tensor_model_parallel_size();
    sizes.pipeline = config.pipeline_model_parallel_size();
    sizes.context = config.context_parallel_size();
    sizes.expert_model = ep;
    sizes.expert_tensor = etp;
    MCC_RETURN_IF_ERROR(
        parallel::RankLayout::Create(world_size, sizes).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<pipeline::PipelineOptions> PipelineOptionsFromConfig(
    const TrainConfig& config, int microbatches) {
  pipeline::PipelineOptions options;
  options.overlap_p2p = !config.no_overlap_p2p_communication();
  MCC_ASSIGN_OR_RETURN(pipeline::PipelineConfig split,
                       PipelineConfigFromConfig(config));
  const int chunks = split.virtual_stages();
  const std::string name = config.pipeline_schedule();
  if (name == "1f1b") {
    options.schedule = chunks > 1 ? pipeline::ScheduleKind::kInterleaved
                                  : pipeline::ScheduleKind::kOneFOneB;
  } else if (name == "interleaved") {
    if (chunks == 1 && split.pipeline_size > 1) {
      return absl::InvalidArgumentError(
          "--pipeline-schedule interleaved needs virtual stages "
          "(--num-layers-per-virtual-pipeline-stage)");
    }
    options.schedule = pipeline::ScheduleKind::kInterleaved;
  } else if (name == "zb-h1") {
    if (chunks > 1) {
      return absl::InvalidArgumentError(
          "--pipeline-schedule zb-h1 runs one model chunk per stage, not "
          "--num-layers-per-virtual-pipeline-stage's virtual stages");
    }
    options.schedule = pipeline::ScheduleKind::kZeroBubbleH1;
  } else if (name == "zbv") {
    // PipelineConfigFromConfig refused any other chunk count, naming the
    // flags.
    options.schedule = pipeline::ScheduleKind::kZeroBubbleV;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--pipeline-schedule: '", name,
                     "' is not 1f1b, interleaved, zb-h1 or zbv"));
  }
  if (split.pipeline_size == 1) {
    options.schedule = pipeline::ScheduleKind::kNoPipelining;
    return options;
  }
  const std::string& path = config.pipeline_schedule_file();
  if (path.empty()) return options;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--pipeline-schedule-file: cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  const pipeline::ScheduleShape shape{split.pipeline_size, chunks, microbatches,
                                      split.v_shape};
  auto table = pipeline::ReadScheduleCsv(text.str(), shape);
  if (!table.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-schedule-file ", path, ": ", table.status().message()));
  }
  // What the executor checks before the first step, here before launch.
  auto reference = pipeline::GenerateScheduleTable(
      split.v_shape ? pipeline::ScheduleKind::kZeroBubbleV
      : chunks > 1  ? pipeline::ScheduleKind::kInterleaved
                    : pipeline::ScheduleKind::kOneFOneB,
      shape);
  if (!reference.ok()) return reference.status();
  MCC_ASSIGN_OR_RETURN(pipeline::ScheduleCheck bound,
                       pipeline::CheckSchedule(*reference));
  const int max_held =
      *std::max_element(bound.peak_held.begin(), bound.peak_held.end());
  if (auto check = pipeline::CheckSchedule(*table, max_held); !check.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-schedule-file ", path, ": ", check.status().message()));
  }
  options.table =
      std::make_shared<const pipeline::ScheduleTable>(*std::move(table));
  return options;
}

absl::Status CheckExpertLayout(const TrainConfig& config) {
  const int ep = config.expert_model_parallel_size();
  const int tp = config.tensor_model_parallel_size();
  // ETP 0 is TP's under SP (Megatron's default), else 1 (job.cc).
  const int etp = config.expert_tensor_parallel_size() == 0
                      ? (config.sequence_parallel() ? tp : 1)
                      : config.expert_tensor_parallel_size();
  if (config.num_experts() == 0 || (ep <= 1 && etp <= 1)) {
    return absl::OkStatus();
  }
  const std::string what =
      absl::StrCat("--expert-model-parallel-size ", ep,
                   " / --expert-tensor-parallel-size ", etp);
  if (tp > 1 && !config.sequence_parallel()) {
    // Without SP every TP rank routes the same tokens: the expert groups
    // would count them TP times (Megatron's layout takes SP's shards).
    return absl::UnimplementedError(absl::StrCat(
        what, " with --tensor-model-parallel-size ", tp,
        ": expert parallelism beside tensor parallelism needs "
        "--sequence-parallel (each TP rank routing its own tokens); give it, "
        "or TP 1, or EP 1 and ETP 1 (experts replicated over TP)"));
  }
  // ZeRO-2/3 (optim_grads, optim_grads_params) shard the expert weights
  // over the expert-data-parallel group, the rest over DP; with
  // --num-distributed-optimizer-instances N the expert-data group splits
  // into N instances as DP does (parallel::RankLayout refuses an N that
  // does not divide it). Checkpoints hold every expert weight whole
  // (ParameterRefs), so EP and ETP both reshard on --load.
  return absl::OkStatus();
}

absl::Status CheckTrainConfig(const TrainConfig& config, int world_size) {
  MCC_RETURN_IF_ERROR(ExitOptionsFromConfig(config).status());
  MCC_RETURN_IF_ERROR(CheckStragglerOptions(config));
  MCC_RETURN_IF_ERROR(RerunCheckOptionsFromConfig(config).status());
  MCC_RETURN_IF_ERROR(CheckDevice(config.device()));
  MCC_RETURN_IF_ERROR(CheckConfigBeforeLaunch(config, world_size));
  MCC_RETURN_IF_ERROR(
      CheckExpertParallelOptions(config, config.num_experts(), world_size));
  MCC_RETURN_IF_ERROR(CheckExpertLayout(config));
  const int model_parallel = config.tensor_model_parallel_size() *
                             config.pipeline_model_parallel_size() *
                             config.context_parallel_size();
  MCC_ASSIGN_OR_RETURN(Batching batching,
                       PlanBatches(config, world_size / model_parallel));
  MCC_ASSIGN_OR_RETURN(
      MicroBatchCalculator batches,
      MicroBatchCalculatorFromConfig(config, world_size / model_parallel));
  // A resumed run checks the ramp from its checkpoint's samples on.
  if (config.load().empty()) {
    MCC_RETURN_IF_ERROR(CheckBatchRampAhead(config, batches, 0));
  }
  MCC_ASSIGN_OR_RETURN(pipeline::PipelineConfig split,
                       PipelineConfigFromConfig(config));
  MCC_RETURN_IF_ERROR(
      pipeline::ValidateMicroBatches(split, batching.num_microbatches));
  MCC_RETURN_IF_ERROR(
      PipelineOptionsFromConfig(config, batching.num_microbatches).status());
  MCC_RETURN_IF_ERROR(OptimizerConfigFromConfig(config).status());
  MCC_RETURN_IF_ERROR(CheckOptimizerOffload(config));
  MCC_RETURN_IF_ERROR(Fp8RecipeFromConfig(config).status());
  MCC_RETURN_IF_ERROR(ScheduleFromConfig(config).status());
  MCC_RETURN_IF_ERROR(
      fsdp::ParseShardingStrategy(config.data_parallel_sharding_strategy())
          .status());
  MCC_RETURN_IF_ERROR(CheckpointOptionsFromConfig(config).status());
  MCC_RETURN_IF_ERROR(LocalCheckpointSettingsFromConfig(config).status());
  if (config.train_iters() <= 0) {
    return absl::InvalidArgumentError("--train-iters must be positive");
  }
  if (config.log_interval() <= 0) {
    return absl::InvalidArgumentError("--log-interval must be positive");
  }
  MCC_RETURN_IF_ERROR(TimelineProfileFromConfig(config, world_size).status());
  return absl::OkStatus();
}

absl::StatusOr<LocalCheckpointSettings> LocalCheckpointSettingsFromConfig(
    const TrainConfig& config) {
  LocalCheckpointSettings f;
  const std::string type = config.non_persistent_ckpt_type();
  f.save_interval = config.non_persistent_save_interval();
  f.options.dir = config.non_persistent_local_ckpt_dir();
  f.options.replicate = config.replication();
  f.options.replication_jump = config.replication_jump();
  const int factor = config.replication_factor();
  if (!type.empty() && type != "local") {
    return absl::InvalidArgumentError(
        absl::StrCat("--non-persistent-ckpt-type ", type,
                     " is not implemented; 'local' is (with "
                     "--non-persistent-local-ckpt-dir)"));
  }
  f.enabled = type == "local";
  if (!f.enabled) {
    const char* needs_type =
        !f.options.dir.empty()            ? "--non-persistent-local-ckpt-dir"
        : f.save_interval != 0            ? "--non-persistent-save-interval"
        : f.options.replicate             ? "--replication"
        : f.options.replication_jump != 0 ? "--replication-jump"
        : factor != 2                     ? "--replication-factor"
                                          : nullptr;
    if (needs_type != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(needs_type, " needs --non-persistent-ckpt-type local"));
    }
    return f;
  }
  if (f.options.dir.empty()) {
    return absl::InvalidArgumentError(
        "--non-persistent-ckpt-type local needs "
        "--non-persistent-local-ckpt-dir DIR");
  }
  if (f.save_interval <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--non-persistent-ckpt-type local needs a positive "
                     "--non-persistent-save-interval (got ",
                     f.save_interval, ")"));
  }
  if (f.options.replication_jump < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replication-jump ", f.options.replication_jump, " is negative"));
  }
  if (f.options.replication_jump != 0 && !f.options.replicate) {
    return absl::InvalidArgumentError("--replication-jump needs --replication");
  }
  if (factor != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replication-factor ", factor,
                     " is not implemented; 2 (one peer copy) is"));
  }
  return f;
}

}  // namespace training
}  // namespace mcc
