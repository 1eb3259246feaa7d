#include "training/trainer.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/ops/expert_weight_packing.h"
#include "core/ops/loss_totals.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "glog/logging.h"
#include "observability/trace.h"

namespace mcc {
namespace training {
namespace {

int GroupSize(const comm::ProcessGroup* group) {
  return group == nullptr ? 1 : group->size();
}

// Sums each value over `group` in about fp64 precision: each travels as two
// fp32 halves (the sum of the high halves and that of the low ones).
absl::StatusOr<std::vector<double>> SumOverGroup(std::vector<double> values,
                                                 comm::ProcessGroup* group) {
  if (GroupSize(group) == 1) return values;
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor t = Tensor::Zeros({2 * n}, DType::kFloat32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    p[2 * i] = static_cast<float>(values[i]);
    p[2 * i + 1] = static_cast<float>(values[i] - p[2 * i]);
  }
  // The group moves only its own device's tensors (the test device's or a
  // GPU's): the values travel there and back through the copy hook.
  if (group->device() != t.device()) {
    MCC_ASSIGN_OR_RETURN(Tensor on_device, t.To(group->device()));
    MCC_RETURN_IF_ERROR(group->AllReduceSync(&on_device, comm::ReduceOp::kSum));
    MCC_ASSIGN_OR_RETURN(t, on_device.To(Device::CPU()));
    p = t.data<float>();
  } else {
    MCC_RETURN_IF_ERROR(group->AllReduceSync(&t, comm::ReduceOp::kSum));
  }
  for (int64_t i = 0; i < n; ++i) {
    values[i] = static_cast<double>(p[2 * i]) + p[2 * i + 1];
  }
  return values;
}

double SecondsSince(absl::Time start) {
  return absl::ToDoubleSeconds(absl::Now() - start);
}

absl::Status CheckModels(const std::vector<parallel::Model*>& models) {
  if (models.empty()) {
    return absl::InvalidArgumentError("trainer: no models");
  }
  for (size_t i = 0; i < models.size(); ++i) {
    if (models[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer: model chunk ", i, " is null"));
    }
  }
  return absl::OkStatus();
}

// The trainer's device buffer, read to the host once per step: the
// optimizer's gradient statistics, this rank's loss totals, and the totals
// packed and summed over the data-parallel group.
constexpr int64_t kStatsBegin = 0;
constexpr int64_t kTotalsBegin = 4;
constexpr int64_t kPackedBegin = kTotalsBegin + ops::kLossTotalsSize;
constexpr int64_t kBufferSize = kPackedBegin + ops::kPackedLossTotalsSize;

// A step's (or an evaluation's) loss totals in `buffer`, summed over
// `group` on the device: no host synchronisation.
absl::Status ReduceLossTotals(const Tensor& totals, comm::ProcessGroup* group,
                              const Tensor& buffer) {
  MCC_ASSIGN_OR_RETURN(Tensor local, buffer.Slice(kTotalsBegin, kPackedBegin));
  MCC_RETURN_IF_ERROR(local.CopyFrom(totals));
  if (GroupSize(group) == 1) return absl::OkStatus();
  MCC_ASSIGN_OR_RETURN(Tensor packed, buffer.Slice(kPackedBegin, kBufferSize));
  MCC_RETURN_IF_ERROR(ops::PackLossTotals(local, &packed));
  return group->AllReduceSync(&packed, comm::ReduceOp::kSum);
}

// The buffer's values on the host: the buffer itself on the CPU, else one
// device-to-host copy into `host` (fp32 [kBufferSize] on the CPU).
absl::StatusOr<const float*> ReadBuffer(const Tensor& buffer, Tensor* host) {
  if (buffer.device().is_cpu()) return buffer.data<float>();
  MCC_RETURN_IF_ERROR(host->CopyFrom(buffer));
  return host->data<float>();
}

// The loss totals of a buffer read by ReadBuffer (summed over `group`).
absl::StatusOr<ops::LossTotalValues> TotalsOf(const float* host,
                                              comm::ProcessGroup* group) {
  if (GroupSize(group) == 1) {
    return ops::LossTotalsFromHost({host + kTotalsBegin, ops::kLossTotalsSize});
  }
  return ops::LossTotalsFromHost(
      {host + kPackedBegin, ops::kPackedLossTotalsSize});
}

}  // namespace

absl::StatusOr<double> MeanOverGroup(double local, comm::ProcessGroup* group) {
  MCC_ASSIGN_OR_RETURN(std::vector<double> sum, SumOverGroup({local}, group));
  return sum[0] / GroupSize(group);
}

absl::StatusOr<EvalMetrics> Evaluate(pipeline::PipelineExecutor* executor,
                                     comm::ProcessGroup* dp_group,
                                     int num_microbatches) {
  if (executor == nullptr) {
    return absl::InvalidArgumentError("evaluation: no pipeline executor");
  }
  if (num_microbatches < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "evaluation: ", num_microbatches, " micro-batches (must be >= 0)"));
  }
  Tensor totals = Tensor::Zeros({ops::kLossTotalsSize}, DType::kFloat32);
  if (num_microbatches > 0) {
    MCC_ASSIGN_OR_RETURN(
        pipeline::PipelineStepResult run,
        executor->Run(num_microbatches, 0.0f, /*forward_only=*/true));
    totals = run.loss_totals;
  }
  // Summed on the device where the group reduces (or the losses are), then
  // one read.
  const Device device =
      GroupSize(dp_group) > 1 ? dp_group->device() : totals.device();
  const Tensor buffer = Tensor::Zeros({kBufferSize}, DType::kFloat32, device);
  MCC_RETURN_IF_ERROR(ReduceLossTotals(totals, dp_group, buffer));
  Tensor host = Tensor::Empty({kBufferSize}, DType::kFloat32);
  MCC_ASSIGN_OR_RETURN(const float* values, ReadBuffer(buffer, &host));
  MCC_ASSIGN_OR_RETURN(const ops::LossTotalValues total,
                       TotalsOf(values, dp_group));
  EvalMetrics m;
  m.sum = total.sum;
  m.tokens = total.tokens;
  m.loss = m.tokens > 0 ? m.sum / m.tokens : 0.0;
  return m;
}

absl::StatusOr<std::unique_ptr<data_parallel::DataParallel>> WrapDataParallel(
    const std::vector<parallel::Model*>& models, comm::ProcessGroup* dp,
    comm::ProcessGroup* pipeline, fsdp::FsdpConfig config) {
  MCC_RETURN_IF_ERROR(CheckModels(models));
  if (!fsdp::ShardsGradients(config.strategy)) {
    data_parallel::DdpConfig ddp = config.ddp;
    ddp.use_distributed_optimizer =
        config.strategy == fsdp::ShardingStrategy::kOptim;
    MCC_ASSIGN_OR_RETURN(
        auto replicated,
        data_parallel::DistributedDataParallel::Wrap(models, dp, ddp));
    return std::unique_ptr<data_parallel::DataParallel>(std::move(replicated));
  }
  // Every chunk of this rank under one wrapper: the pipeline's DP peers
  // run the same schedule, so their per-unit collectives match.
  (void)pipeline;
  MCC_ASSIGN_OR_RETURN(
      auto sharded, fsdp::FullyShardedDataParallel::Wrap(models, dp, config));
  return std::unique_ptr<data_parallel::DataParallel>(std::move(sharded));
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    TrainerParts parts, optim::LrSchedule schedule, TrainerOptions options) {
  MCC_RETURN_IF_ERROR(CheckModels(parts.models));
  if (parts.executor == nullptr && parts.stages.size() != parts.models.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: without a pipeline executor the trainer needs the ",
        parts.models.size(), " model chunks as pipeline stages too (got ",
        parts.stages.size(), ")"));
  }
  if (parts.optimizer == nullptr) {
    return absl::InvalidArgumentError("trainer: no optimizer");
  }
  const bool cp = GroupSize(parts.context_group) > 1;
  if (cp && parts.data_parallel != nullptr &&
      GroupSize(parts.data_parallel->dp_group()) !=
          GroupSize(parts.dp_group) * GroupSize(parts.context_group)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: with context parallelism (size ",
        GroupSize(parts.context_group),
        ") data parallelism must reduce gradients over DP x CP (size ",
        GroupSize(parts.dp_group) * GroupSize(parts.context_group), "), not ",
        GroupSize(parts.data_parallel->dp_group()), " ranks"));
  }
  if (!cp && parts.data_parallel != nullptr &&
      parts.data_parallel->dp_group() != parts.dp_group &&
      GroupSize(parts.data_parallel->dp_group()) + GroupSize(parts.dp_group) >
          2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: the losses' data-parallel group (size ",
        GroupSize(parts.dp_group),
        ") is not the one data parallelism reduces gradients over (size ",
        GroupSize(parts.data_parallel->dp_group()), ")"));
  }
  auto trainer = std::unique_ptr<Trainer>(
      new Trainer(std::move(parts), std::move(schedule), std::move(options)));
  TrainerParts& p = trainer->parts_;
  if (p.executor == nullptr) {
    pipeline::PipelineOptions one_stage;
    one_stage.schedule = pipeline::ScheduleKind::kNoPipelining;
    MCC_ASSIGN_OR_RETURN(
        trainer->own_executor_,
        pipeline::PipelineExecutor::Create(p.stages, nullptr, one_stage));
    p.executor = trainer->own_executor_.get();
  }
  data_parallel::DataParallel* dp = p.data_parallel;
  if (p.executor != nullptr && dp != nullptr) {
    // Data parallelism reduces only on each chunk's last micro-batch.
    p.executor->SetLastMicrobatchCallback(
        [dp](bool last) { dp->set_is_last_microbatch(last); });
  }
  return trainer;
}

Trainer::Trainer(TrainerParts parts, optim::LrSchedule schedule,
                 TrainerOptions options)
    : parts_(std::move(parts)),
      schedule_(std::move(schedule)),
      options_(std::move(options)) {
  step_buffer_ =
      Tensor::Zeros({kBufferSize}, DType::kFloat32, parts_.optimizer->device());
  grad_stats_ = *step_buffer_.Slice(kStatsBegin, kTotalsBegin);
  if (!step_buffer_.device().is_cpu()) {
    host_buffer_ = Tensor::Empty({kBufferSize}, DType::kFloat32);
  }
}

Trainer::~Trainer() {
  if (parts_.executor != nullptr && parts_.data_parallel != nullptr) {
    parts_.executor->SetLastMicrobatchCallback(nullptr);
  }
}

absl::Status Trainer::WaitForParameters() {
  if (parts_.data_parallel == nullptr) return absl::OkStatus();
  return parts_.data_parallel->FinishParamGather();
}

absl::Status Trainer::FinalizeModelGrads() {
  data_parallel::DataParallel* dp = parts_.data_parallel;
  if (dp != nullptr) {
    // Gathers no unit's forward waited for (a stage without them).
    MCC_RETURN_IF_ERROR(dp->FinishParamGather());
    dp->set_is_last_microbatch(true);
  }
  if (dp != nullptr && dp->shards_gradients()) {
    // The gradients live in the wrapper's shards once synced: the tied
    // copies are summed there, then the sequence-parallel ones.
    MCC_RETURN_IF_ERROR(dp->FinishGradSync());
    MCC_RETURN_IF_ERROR(dp->SyncSharedGradients(parts_.embedding_group));
    return dp->FinalizeGradients();
  }
  // Both tied copies on this stage (ZB-V's stage 0): summed here.
  MCC_RETURN_IF_ERROR(parallel::SumSharedGradientsWithinStage(parts_.models));
  for (parallel::Model* model : parts_.models) {
    MCC_RETURN_IF_ERROR(model->SyncSharedGradients(parts_.embedding_group));
  }
  if (dp == nullptr) {
    for (parallel::Model* model : parts_.models) {
      MCC_RETURN_IF_ERROR(model->FinalizeGradients());
    }
    return absl::OkStatus();
  }
  MCC_RETURN_IF_ERROR(dp->FinishGradSync());
  // Replaces the model's: under the sharded strategies the gradients live
  // in the wrapper's shards.
  return dp->FinalizeGradients();
}

absl::StatusOr<StepMetrics> Trainer::Step(int num_microbatches,
                                          int64_t iteration) {
  if (num_microbatches <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: iteration ", iteration, " has ",
                     num_microbatches, " micro-batches (must be > 0)"));
  }
  StepMetrics m;
  m.iteration = iteration;
  m.num_microbatches = num_microbatches;
  data_parallel::DataParallel* dp = parts_.data_parallel;
  // Each micro-batch's mean loss counts 1/M, times the loss scale.
  const float grad_scale =
      static_cast<float>(parts_.optimizer->loss_scale() / num_microbatches);
  // Open from the statistics' reduction to the end of the update.
  std::optional<observability::TraceScope> trace_optimizer;
  // The micro-batches through the schedule, the gradient sync, and the
  // step's one read of its loss and gradient statistics.
  auto run = [&]() -> absl::StatusOr<const float*> {
    trace_optimizer.reset();
    if (dp != nullptr) {
      MCC_RETURN_IF_ERROR(dp->BeginStep());
    } else {
      for (parallel::Model* model : parts_.models) model->ZeroGradients();
    }
    absl::Time start = absl::Now();
    // The weights stay as they are until the optimizer step below: the
    // packs live for the micro-batches only.
    std::optional<ops::ScopedExpertWeightPacking> packing;
    if (options_.pack_expert_weights) packing.emplace();
    MCC_ASSIGN_OR_RETURN(pipeline::PipelineStepResult result,
                         parts_.executor->Run(num_microbatches, grad_scale));
    if (packing.has_value()) {
      LOG_FIRST_N(INFO, 1) << absl::StrFormat(
          "MoE expert weights packed for the step's micro-batches: %.1f MiB "
          "(--moe-pack-expert-weights)",
          packing->packed_bytes() / 1048576.0);
      packing.reset();
    }
    m.pipeline = result.stats;
    m.forward_backward_seconds += SecondsSince(start);

    start = absl::Now();
    {
      observability::TraceScope trace("gradient sync", "grad_sync");
      MCC_RETURN_IF_ERROR(FinalizeModelGrads());
    }
    m.grad_sync_seconds += SecondsSince(start);
    if (options_.before_optimizer_step) {
      MCC_RETURN_IF_ERROR(options_.before_optimizer_step(iteration));
    }

    start = absl::Now();
    trace_optimizer.emplace("optimizer step", "optimizer");
    // The loss totals and the gradient statistics meet in one device
    // buffer, and the step's one device-to-host copy reads both (none on
    // the CPU).
    MCC_RETURN_IF_ERROR(
        ReduceLossTotals(result.loss_totals, parts_.dp_group, step_buffer_));
    MCC_RETURN_IF_ERROR(parts_.optimizer->ComputeGradStats(&grad_stats_));
    MCC_ASSIGN_OR_RETURN(const float* values,
                         ReadBuffer(step_buffer_, &host_buffer_));
    m.optimizer_seconds += SecondsSince(start);
    return values;
  };
  // The loss as Megatron reports it, and the unscaled global gradient norm
  // (as ApplyStep reports it), from a read buffer.
  auto loss_of = [&](const float* values) -> absl::StatusOr<double> {
    MCC_ASSIGN_OR_RETURN(const ops::LossTotalValues total,
                         TotalsOf(values, parts_.dp_group));
    m.loss_tokens = total.tokens;
    return total.mean_of_means / GroupSize(parts_.dp_group);
  };
  auto grad_norm_of = [](const float* values) {
    return optim::GradNormOfStats({values + kStatsBegin, 4});
  };

  MCC_ASSIGN_OR_RETURN(const float* values, run());
  MCC_ASSIGN_OR_RETURN(m.loss, loss_of(values));
  if (options_.rerun_step_if) {
    const double grad_norm = grad_norm_of(values);
    MCC_ASSIGN_OR_RETURN(bool rerun,
                         options_.rerun_step_if(iteration, m.loss, grad_norm));
    if (rerun) {
      m.rerun = true;
      if (options_.before_rerun) MCC_RETURN_IF_ERROR(options_.before_rerun());
      MCC_ASSIGN_OR_RETURN(values, run());
      MCC_ASSIGN_OR_RETURN(m.loss, loss_of(values));
    }
  }

  const absl::Time start = absl::Now();
  MCC_ASSIGN_OR_RETURN(
      optim::StepInfo info,
      parts_.optimizer->ApplyStep(
          options_.schedule_position
              ? schedule_.LearningRateAt(options_.schedule_position(iteration))
              : schedule_.LearningRate(iteration),
          {values + kStatsBegin, 4}));
  trace_optimizer.reset();
  m.optimizer_seconds += SecondsSince(start);
  m.lr = info.lr;
  m.grad_norm = info.grad_norm;
  m.num_zeros = info.num_zeros;
  m.skipped = info.skipped;
  m.loss_scale = info.loss_scale;
  return m;
}

absl::StatusOr<EvalMetrics> Trainer::Evaluate(int num_microbatches) {
  return training::Evaluate(parts_.executor, parts_.dp_group, num_microbatches);
}

}  // namespace training
}  // namespace mcc
