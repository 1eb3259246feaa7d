#include "training/run.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/comm_dist_context.h"
#include "core/allocator.h"
#include "core/comm/flight_recorder.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "data/loader.h"
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
#include "training/checkpointing.h"
#include "training/device_choice.h"
#include "training/evaluation.h"
#include "training/job.h"
#include "training/local_checkpointing.h"
#include "training/metrics.h"
#include "training/microbatch_calculator.h"
#include "training/model_batch.h"
#include "training/moe_metrics.h"
#include "training/rerun_check.h"
#include "training/run_options.h"
#include "training/step_flops.h"
#include "training/straggler_detector.h"
#include "training/timeline_profile.h"
#include "training/trainer.h"

namespace mcc {
namespace training {
namespace {

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
    const TrainConfig& config, Job& job,
    const data_parallel::DdpConfig& ddp_config) {
  MCC_ASSIGN_OR_RETURN(
      fsdp::ShardingStrategy strategy,
      fsdp::ParseShardingStrategy(config.data_parallel_sharding_strategy()));
  if (strategy == fsdp::ShardingStrategy::kNoShard &&
      ddp_config.use_distributed_optimizer) {
    strategy = fsdp::ShardingStrategy::kOptim;
  }
  fsdp::FsdpConfig fsdp_config;
  fsdp_config.strategy = strategy;
  fsdp_config.ddp = ddp_config;
  if (job.state != nullptr && job.state->instance() != nullptr) {
    // HSDP (--num-distributed-optimizer-instances).
    fsdp_config.ddp.hybrid.instance = job.state->instance();
    fsdp_config.ddp.hybrid.cross_instance = job.state->cross_instance();
    fsdp_config.ddp.hybrid.expert_instance = job.state->expert_instance();
    fsdp_config.ddp.hybrid.expert_cross_instance =
        job.state->expert_cross_instance();
  }
  // Expert weights (MoE over the expert groups) reduce over expert DP.
  if (job.context.expert_layout) {
    fsdp_config.ddp.expert_data = job.state->expert_data();
  }
  return WrapDataParallel(AsModels(job.model->chunks()), job.grad_dp(),
                          job.pp(), fsdp_config);
}

// --check-for-nan-in-loss-and-grad: an error naming the iteration, rank
// and first non-finite tensor when the step's loss, or a gradient where no
// loss scaler skips such steps by design, is inf or NaN. Every rank of the
// data-parallel group sees the same loss and skip, so all stop together.
absl::Status CheckForNan(const TrainConfig& config, const Job& job,
                         const optim::Optimizer& optimizer,
                         const StepMetrics& step) {
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
  if (!config.check_for_nan_in_loss_and_grad()) {
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
                         const CheckpointOptions& ckpt) {
  if (saved.ok() || !ckpt.continue_on_save_failure) return saved;
  LOG(ERROR) << "checkpoint save failed: " << saved
             << "; training continues (--continue-on-save-failure); the "
                "previous checkpoint under "
             << ckpt.save << " is intact";
  return absl::OkStatus();
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
absl::Status SetUpFlightRecorder(const TrainConfig& config) {
  const std::string dir = config.flight_recorder_dir();
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
  static absl::StatusOr<TensorBoardLog> Create(const TrainConfig& config,
                                               bool log) {
    TensorBoardLog tb;
    const std::string dir = config.tensorboard_dir();
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
absl::Status CheckCudaGraphFlags(const TrainConfig& config, int num_chunks) {
  const char* clash = nullptr;
  if (config.overlap_grad_reduce()) {
    clash = "--overlap-grad-reduce (reduces gradients inside the backward)";
  } else if (config.overlap_param_gather()) {
    clash = "--overlap-param-gather (gathers parameters inside the forward)";
  } else if (fsdp::ShardsGradients(
                 fsdp::ParseShardingStrategy(
                     config.data_parallel_sharding_strategy())
                     .value_or(fsdp::ShardingStrategy::kNoShard))) {
    clash =
        "--data-parallel-sharding-strategy that shards gradients (reduces "
        "and gathers per unit inside the forward and backward)";
  } else if (num_chunks != 1) {
    clash = "virtual pipeline stages (several model chunks per rank)";
  } else if (config.reset_attention_mask() || !config.window_size().empty()) {
    clash =
        "--reset-attention-mask or --window-size (each step copies the "
        "attention's first keys from the host)";
  } else if (!config.fp8_format().empty()) {
    clash = "--fp8-format (its scaling reads each cast's amax on the host)";
  }
  if (clash == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--cuda-graph cannot be combined with ", clash));
}

}  // namespace

absl::Status Run(const TrainConfig& config, ExitConditions* exit_conditions,
                 const RunHooks& hooks) {
  MCC_RETURN_IF_ERROR(SetUpFlightRecorder(config));
  MCC_ASSIGN_OR_RETURN(DeviceChoice device, ChooseDevice(config.device()));
  MCC_ASSIGN_OR_RETURN(std::unique_ptr<Job> job,
                       SetupJob(config, std::move(device)));
  const int dp = job->dp_size();
  MCC_ASSIGN_OR_RETURN(Batching batching, PlanBatches(config, dp));
  // Each step's global batch (ramped by --rampup-batch-size).
  MCC_ASSIGN_OR_RETURN(MicroBatchCalculator step_batches,
                       MicroBatchCalculatorFromConfig(config, dp));
  const int64_t train_iters = config.train_iters();
  const int64_t seq = job->config.seq_length;
  const bool log = job->is_logging_rank();

  // Peak for MFU: measured on rank 0 alone while the others wait.
  double peak_flops = config.peak_tflops() * 1e12;
  if (peak_flops <= 0 && log) {
    peak_flops = MeasureGemmPeakFlops(job->context.dtype, job->context.device);
  }
  // A run that saves where it loads repairs what a killed save left there
  // (rank 0, before any rank reads it; checkpoint_dir.h).
  MCC_ASSIGN_OR_RETURN(CheckpointOptions ckpt,
                       CheckpointOptionsFromConfig(config));
  if (log && !ckpt.load.empty() && SameDirectory(ckpt.load, ckpt.save)) {
    MCC_RETURN_IF_ERROR(RepairCheckpointDir(ckpt.load));
  }
  MCC_RETURN_IF_ERROR(job->Barrier());

  // Resume: the model first, so data parallelism and the optimizer take
  // their copies from the loaded weights.
  TrainingProgress progress;
  MCC_ASSIGN_OR_RETURN(bool resumed, ShouldResume(ckpt.load, ckpt.save, log));
  // Local checkpoints at least as new as --load's are read instead.
  MCC_ASSIGN_OR_RETURN(
      LocalTrainingCheckpoints local,
      StartLocalCheckpoints(config, *job, resumed ? ckpt.load : ""));
  resumed = resumed || !local.restore_dir.empty();
  const std::string load_dir =
      local.restore_dir.empty() ? ckpt.load : local.restore_dir;
  if (resumed) {
    MCC_ASSIGN_OR_RETURN(
        progress, LoadModelCheckpoint(load_dir, *job,
                                      !ckpt.no_load_rng && !ckpt.finetune));
    // --finetune: the weights only; iteration and samples start at 0.
    if (ckpt.finetune) {
      LOG_IF(INFO, log) << "--finetune: the weights of iteration "
                        << progress.iteration
                        << "; iteration, samples, optimizer and RNG restart";
      progress = TrainingProgress();
    }
  }
  // Global samples consumed through the last step: the loader's resume
  // point and each step's batch size under a ramp.
  int64_t consumed_samples = progress.consumed_train_samples;
  MCC_RETURN_IF_ERROR(
      CheckBatchRampAhead(config, step_batches, consumed_samples));

  // Data parallelism and the optimizer.
  data_parallel::DdpConfig ddp_config;
  ddp_config.overlap_grad_reduce = config.overlap_grad_reduce();
  ddp_config.use_distributed_optimizer = config.use_distributed_optimizer();
  ddp_config.overlap_param_gather = config.overlap_param_gather();
  ddp_config.bucket_size_bytes = config.ddp_bucket_size() * 4;
  MCC_ASSIGN_OR_RETURN(auto ddp, MakeDataParallel(config, *job, ddp_config));
  // The schedule: --pipeline-schedule's (1F1B, interleaved with virtual
  // stages) or --pipeline-schedule-file's table across stages, plain
  // gradient accumulation on one.
  MCC_ASSIGN_OR_RETURN(
      pipeline::PipelineOptions pipeline_options,
      PipelineOptionsFromConfig(config, batching.num_microbatches));
  // --cuda-graph: the one chunk's micro-batches captured and replayed
  // (models/gpt/graphed_stage.h refuses the layouts it cannot cover).
  std::unique_ptr<gpt::GraphedStage> graphed;
  std::vector<parallel::PipelineStage*> stages = job->model->stages();
  if (config.cuda_graph()) {
    MCC_RETURN_IF_ERROR(CheckCudaGraphFlags(config, job->model->num_chunks()));
    MCC_ASSIGN_OR_RETURN(graphed,
                         gpt::GraphedStage::Create(job->model->chunk(0)));
    stages = {graphed.get()};
  }
  MCC_ASSIGN_OR_RETURN(auto executor, pipeline::PipelineExecutor::Create(
                                          stages, job->pp(), pipeline_options));
  const std::string schedule_name =
      pipeline_options.table != nullptr
          ? std::string("the --pipeline-schedule-file table")
          : pipeline::ScheduleName(
                job->model->num_chunks() > 1 &&
                        pipeline_options.schedule !=
                            pipeline::ScheduleKind::kZeroBubbleV
                    ? pipeline::ScheduleKind::kInterleaved
                    : pipeline_options.schedule);
  MCC_ASSIGN_OR_RETURN(optim::OptimizerConfig opt_config,
                       OptimizerConfigFromConfig(config));
  optim::OptimizerGroups groups;
  groups.tensor = job->tp();
  groups.pipeline = job->state ? job->state->pipeline() : nullptr;
  groups.model = job->state ? job->state->model() : nullptr;
  if (job->context.expert_layout) {
    groups.expert_tensor_model = job->state->expert_tensor_model();
  }
  MCC_ASSIGN_OR_RETURN(auto optimizer,
                       ddp->CreateOptimizer(opt_config, groups));
  if (config.use_precision_aware_optimizer()) {
    LOG(INFO) << "precision-aware optimizer: "
              << optim::DescribeStatePrecision(opt_config.state_precision)
              << "; " << optimizer->state_bytes()
              << " bytes of optimizer state on this rank";
  }
  MCC_ASSIGN_OR_RETURN(optim::LrSchedule schedule, ScheduleFromConfig(config));
  // The step: micro-batches through the schedule, gradient sync and
  // finalisation, loss scale, clipping, the optimizer.
  TrainerParts parts;
  parts.models = AsModels(job->model->chunks());
  parts.executor = executor.get();
  parts.data_parallel = ddp.get();
  parts.optimizer = optimizer.get();
  parts.dp_group = job->dp();
  parts.context_group = job->cp();
  // Tied embedding and output weights on the first and last stages (both
  // on stage 0 under ZB-V's V: summed there, without the group).
  parts.embedding_group = job->pp() != nullptr && !job->pipeline.v_shape
                              ? job->state->embedding()
                              : nullptr;
  // The cross-rank consistency checks' replica groups.
  data_parallel::ReplicaGroupSources replica_sources;
  if (job->state != nullptr) {
    replica_sources.data = job->state->data();
    replica_sources.tensor = job->state->tensor();
    replica_sources.context = job->state->context();
    replica_sources.embedding = job->state->embedding();
    if (job->context.expert_layout) {
      replica_sources.expert_data = job->state->expert_data();
    }
  }
  const int grad_check_interval = config.check_grad_consistency_interval();
  const int log_interval = config.log_interval();
  auto is_log_iteration = [&](int64_t iteration) {
    return iteration % log_interval == 0 || iteration == train_iters;
  };
  const bool per_layer_grad_norms = config.timing_log_level() >= 2;
  std::vector<double> layer_grad_norms;
  TrainerOptions trainer_options;
  trainer_options.pack_expert_weights =
      config.moe_pack_expert_weights() && config.num_experts() > 0;
  // --rerun-mode validate_results: what the check saw of the first run.
  MCC_ASSIGN_OR_RETURN(std::optional<RerunCheckOptions> rerun_options,
                       RerunCheckOptionsFromConfig(config));
  std::optional<RerunCheck> rerun_check;
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
                        ? absl::StrCat("; injecting ",
                                       config.error_injection_type(), " every ",
                                       rerun_options->injection_rate,
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
  if (step_batches.ramping()) {
    // Megatron's sample-counted schedule: the samples through the step over
    // the final global batch.
    trainer_options.schedule_position = [&](int64_t) {
      return static_cast<double>(
                 consumed_samples +
                 step_batches.GlobalBatchSize(consumed_samples)) /
             static_cast<double>(step_batches.global_batch());
    };
  }
  MCC_ASSIGN_OR_RETURN(
      auto trainer,
      Trainer::Create(parts, schedule, std::move(trainer_options)));
  const EvaluateMicroBatches evaluate_with_trainer = [&trainer](int n) {
    return trainer->Evaluate(n);
  };
  if (resumed && !ckpt.no_load_optim && !ckpt.finetune) {
    // Sharded parameters are made whole around loads and saves.
    MCC_RETURN_IF_ERROR(ddp->GatherFullParams());
    MCC_RETURN_IF_ERROR(
        LoadOptimizerCheckpoint(load_dir, *job, optimizer.get()));
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
  const DistContext dist = MakeProcessGroupDistContext(ckpt_group.get());
  AsyncCheckpointSaver async_saver;

  // Data.
  const int eval_iters = config.eval_iters();
  const int eval_interval = std::max(1, config.eval_interval());
  const int64_t eval_samples =
      std::max<int64_t>(1, (train_iters / eval_interval + 1) * eval_iters *
                               batching.global_batch);
  MCC_ASSIGN_OR_RETURN(
      auto datasets,
      BuildDatasets(
          config, *job,
          {train_iters * batching.global_batch, eval_samples,
           std::max<int64_t>(1, eval_iters * batching.global_batch)}));
  data::LoaderConfig loader_config;
  loader_config.micro_batch_size = config.micro_batch_size();
  loader_config.dp_rank = job->dp_rank();
  loader_config.dp_size = dp;
  loader_config.consumed_samples = progress.consumed_train_samples;
  if (job->tokenizer != nullptr) {
    loader_config.eod = job->tokenizer->eod();
    loader_config.eod_mask_loss = config.eod_mask_loss();
    // Only learned position embeddings read positions (tools/train warns).
    loader_config.reset_position_ids =
        config.reset_position_ids() &&
        job->config.position_embedding == gpt::PositionEmbedding::kLearned;
    loader_config.reset_attention_mask = config.reset_attention_mask();
  }
  MCC_ASSIGN_OR_RETURN(auto train_loader,
                       data::DataLoader::Create(datasets[0], loader_config));
  data::LoaderConfig eval_loader_config = loader_config;
  eval_loader_config.consumed_samples = 0;

  MetricsLogger logger(log, config.metrics_file());
  MCC_ASSIGN_OR_RETURN(TensorBoardLog tensorboard,
                       TensorBoardLog::Create(config, log));
  const int tb_interval = std::max(1, config.tensorboard_log_interval());
  // Each step's model FLOPs for TFLOP/s and MFU (attention limited to what
  // packed documents and a window leave).
  StepFlopsCounter step_flops(
      job->config, loader_config.reset_attention_mask,
      job->dp() != nullptr ? job->GroupFor(job->dp(), Device::CPU()) : nullptr);
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
        job->config.padded_vocab_size(config.tensor_model_parallel_size()), seq,
        params / 1e6, job->world_size, config.tensor_model_parallel_size(),
        job->pipeline.pipeline_size, dp, schedule_name, batching.global_batch,
        config.micro_batch_size(), dp, batching.num_microbatches,
        DTypeName(job->context.dtype));
    if (step_batches.ramping()) {
      const BatchSizeRampup& r = *step_batches.rampup();
      LOG(INFO) << absl::StrFormat(
          "batch-size ramp-up: global batch %d, growing by %d every %.6g "
          "samples to %d over %d samples; %d at %d consumed samples",
          r.start, r.increment, step_batches.samples_per_increment(),
          step_batches.global_batch(), r.samples,
          step_batches.GlobalBatchSize(consumed_samples), consumed_samples);
    }
    LOG(INFO) << absl::StrFormat("GEMM peak for MFU: %.1f GFLOP/s",
                                 peak_flops / 1e9);
    LOG(INFO) << step_flops.Describe();
    LOG(INFO) << DescribeDistribution(*job, *ddp, pipeline_options);
  }

  Timers timers;
  const bool profile_ops = config.timing_log_level() >= 2;
  OpProfile::Enable(profile_ops);
  OpProfile::Reset();
  comm::ProcessGroup* const world_group =
      job->world.has_value() ? job->world->group.get() : nullptr;
  std::optional<StragglerDetector> straggler;
  int straggler_steps = 0;  // In the detector's window.
  if (config.log_straggler()) {
    straggler.emplace(world_group, config.straggler_threshold());
  }
  const ExitOptions& exit_options = exit_conditions->options();
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
    TrainingProgress now{iteration, consumed_samples};
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
    if (hooks.after_save && saved.ok()) {
      MCC_RETURN_IF_ERROR(hooks.after_save(iteration, ckpt.save));
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
  double window_samples = 0;
  double window_flops = 0;
  if (progress.iteration >= train_iters && log) {
    LOG(INFO) << "the loaded checkpoint is at iteration " << progress.iteration
              << " of --train-iters " << train_iters << ": nothing to train";
  }
  const int hash_interval =
      config.check_weight_hash_across_dp_replicas_interval();
  MCC_ASSIGN_OR_RETURN(TimelineProfileConfig profile_config,
                       TimelineProfileFromConfig(config, job->world_size));
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
  if (hooks.after_setup) {
    MCC_RETURN_IF_ERROR(
        hooks.after_setup(*job, *trainer, progress.iteration + 1));
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
    const int64_t step_batch = step_batches.GlobalBatchSize(consumed_samples);
    const int step_microbatches =
        step_batches.NumMicroBatches(consumed_samples);
    timers.Start("data");
    {
      observability::TraceScope trace("data loading", "data");
      for (int m = 0; m < step_microbatches; ++m) {
        MCC_ASSIGN_OR_RETURN(data::MicroBatch mb, train_loader->Next());
        step_flops.Add(mb);
        batches.push_back(ModelBatchOf(mb, loader_config));
      }
    }
    timers.Stop("data");
    MCC_ASSIGN_OR_RETURN(const double step_model_flops,
                         step_flops.TakeStepFlops(step_batch));
    // (Staged to the device; under --cuda-graph the graphed stage adopts
    // them from the model.)
    MCC_RETURN_IF_ERROR(job->model->SetMicroBatches(std::move(batches)));
    ChaosSlowStep();
    rng_calls_before_step = job->model->rng_calls();
    MCC_ASSIGN_OR_RETURN(StepMetrics step,
                         trainer->Step(step_microbatches, iteration));
    consumed_samples += step_batch;
    window_samples += step_batch;
    window_flops += step_model_flops;
    // MoE: the routers' expert biases step by the load just routed.
    MCC_RETURN_IF_ERROR(job->model->UpdateExpertBias(job->dp()));
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
    MCC_RETURN_IF_ERROR(CheckForNan(config, *job, *optimizer, step));
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
          "batch-size", static_cast<double>(step_batch), iteration));
      const double step_seconds = step.forward_backward_seconds +
                                  step.grad_sync_seconds +
                                  step.optimizer_seconds;
      if (step_seconds > 0) {
        MCC_RETURN_IF_ERROR(
            tensorboard.Add("iteration-time", step_seconds, iteration));
        MCC_RETURN_IF_ERROR(tensorboard.Add(
            "tokens-per-second", step_batch * seq / step_seconds, iteration));
        MCC_RETURN_IF_ERROR(tensorboard.Add(
            "throughput", step_model_flops / step_seconds / 1e12, iteration));
        if (peak_flops > 0) {
          MCC_RETURN_IF_ERROR(tensorboard.Add(
              "mfu", step_model_flops / step_seconds / peak_flops, iteration));
        }
      }
      if (config.log_timers_to_tensorboard()) {
        MCC_RETURN_IF_ERROR(tensorboard.Add(
            "forward-backward-time", step.forward_backward_seconds, iteration));
        MCC_RETURN_IF_ERROR(tensorboard.Add("grad-sync-time",
                                            step.grad_sync_seconds, iteration));
        MCC_RETURN_IF_ERROR(tensorboard.Add("optimizer-time",
                                            step.optimizer_seconds, iteration));
      }
      if (config.log_memory_to_tensorboard()) {
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
      m.consumed_samples = consumed_samples;
      m.global_batch_size = step_batch;
      m.loss = window_loss / window_steps;
      m.lr = step.lr;
      m.grad_norm = step.grad_norm;
      m.loss_scale = step.loss_scale;
      m.skipped = skipped;
      m.seconds_per_iteration = seconds;
      // Over the window's samples, which a ramp changes step by step.
      const double samples_per_step = window_samples / window_steps;
      m.tokens_per_sec = samples_per_step * seq / seconds;
      const double flops_per_step = window_flops / window_steps;
      m.tflops = flops_per_step / seconds / 1e12;
      m.mfu = peak_flops > 0 ? flops_per_step / seconds / peak_flops : 0;
      if (m.mfu > 1.0 && !warned_mfu_above_peak) {
        warned_mfu_above_peak = true;
        const bool given = config.peak_tflops() > 0;
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
      if (config.log_params_norm()) {
        // Collective over the model and shard groups: every rank logs here.
        MCC_ASSIGN_OR_RETURN(m.params_norm, optimizer->ParamsNorm());
      }
      m.eta_seconds = seconds * (train_iters - iteration);
      logger.Log(m, config.timing_log_level() > 0 ? &timers : nullptr);
      if (log && !layer_grad_norms.empty()) {
        LOG(INFO) << FormatLayerGradNorms(layer_grad_norms);
      }
      layer_grad_norms.clear();
      // MoE: each stage's layers (collective over DP and CP), logged by its
      // first DP, TP and CP rank; TensorBoard holds rank 0's.
      MCC_ASSIGN_OR_RETURN(
          auto moe,
          TakeMoeStatsOverDp(job->model.get(), job->dp(), job->context.device));
      if (job->dp_rank() == 0 &&
          (job->tp() == nullptr || job->tp()->rank() == 0) &&
          (job->cp() == nullptr || job->cp()->rank() == 0)) {
        for (const auto& layer : moe) LOG(INFO) << MoeStatsLine(layer);
      }
      for (const auto& [tag, value] : MoeScalars(moe)) {
        MCC_RETURN_IF_ERROR(tensorboard.Add(tag, value, iteration));
      }
      if (!moe.empty()) MCC_RETURN_IF_ERROR(tensorboard.Flush());
      // The window of the run's first step holds its one-time costs (lazy
      // connections wait on the slowest peer outside any collective), so it
      // is not reported. Every rank skips alike.
      if (straggler.has_value() && straggler_steps > 0) {
        // Collective over the world: every rank reaches it at this step.
        MCC_ASSIGN_OR_RETURN(StragglerReport report,
                             straggler->EndWindow(straggler_steps));
        if (log) {
          LOG(INFO) << "iteration " << iteration << ": "
                    << report.Format(config.straggler_minmax_count());
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
      window_samples = 0;
      window_flops = 0;
    }
    MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
    if (hooks.after_step) MCC_RETURN_IF_ERROR(hooks.after_step(step));
    if (datasets[1] != nullptr && eval_iters > 0 &&
        iteration % eval_interval == 0) {
      observability::TraceScope trace("evaluation", "eval");
      // The same validation micro-batches every time, so values compare.
      MCC_ASSIGN_OR_RETURN(
          auto valid_loader,
          data::DataLoader::Create(datasets[1], eval_loader_config));
      MCC_ASSIGN_OR_RETURN(double vloss,
                           EvaluateLoss(*job, valid_loader.get(), eval_iters,
                                        evaluate_with_trainer));
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
      if (hooks.after_evaluation) {
        MCC_RETURN_IF_ERROR(hooks.after_evaluation(iteration, vloss));
      }
    }
    const bool save_due = ckpt.ShouldSave(iteration, train_iters);
    if (save_due) MCC_RETURN_IF_ERROR(save_checkpoint(iteration));
    if (!save_due && local.Due(iteration)) {
      // A failed local save leaves --save's checkpoints: logged, not fatal.
      TrainingProgress now{iteration, consumed_samples};
      MCC_RETURN_IF_ERROR(ddp->GatherFullParams());
      const absl::Status saved = SaveTrainingCheckpoint(
          "", *job, optimizer.get(), schedule, now, local.dist, nullptr, 0,
          local.checkpointer.get());
      MCC_RETURN_IF_ERROR(ddp->ReleaseFullParams());
      LOG_IF(WARNING, !saved.ok()) << "local checkpoint save: " << saved;
    }
    iteration_trace.reset();
    MCC_RETURN_IF_ERROR(profile.AfterStep(iteration));
    ChaosKillAfterIteration(iteration);
    MCC_ASSIGN_OR_RETURN(ExitReason exit_reason,
                         exit_conditions->After(iteration));
    if (exit_reason != ExitReason::kNone) {
      // Megatron's order: save (unless this step just did), then exit 0.
      if (!save_due && !ckpt.save.empty()) {
        MCC_RETURN_IF_ERROR(save_checkpoint(iteration));
      }
      if (log) {
        LOG(INFO) << "stopping after iteration " << iteration << " of "
                  << train_iters << ": "
                  << DescribeExitReason(exit_reason, exit_options)
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
    MCC_ASSIGN_OR_RETURN(double tloss,
                         EvaluateLoss(*job, test_loader.get(), eval_iters,
                                      evaluate_with_trainer));
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
  // Each rank's own peak (the metrics file has rank 0's): the planner's
  // per-stage memory is checked against these (tools/plan_memory_e2e_test).
  LOG(INFO) << absl::StrFormat(
      "rank %d peak memory: %d bytes", job->rank,
      GetAllocator(job->context.device)->Stats().peak_bytes);
  if (log) {
    LogBf16GemmChoices();
    LOG(INFO) << absl::StrFormat("trained %d iterations in %.1f s", train_iters,
                                 absl::ToDoubleSeconds(absl::Now() - start));
  }
  return job->Barrier();
}

}  // namespace training
}  // namespace mcc
