#include "training/trainer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "core/tensor.h"

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
  MCC_RETURN_IF_ERROR(group->AllReduceSync(&t, comm::ReduceOp::kSum));
  for (int64_t i = 0; i < n; ++i) {
    values[i] = static_cast<double>(p[2 * i]) + p[2 * i + 1];
  }
  return values;
}

double SecondsSince(absl::Time start) {
  return absl::ToDoubleSeconds(absl::Now() - start);
}

absl::Status CheckChunks(const ModelChunks& chunks,
                         const pipeline::PipelineExecutor* executor) {
  if (chunks.empty()) {
    return absl::InvalidArgumentError("trainer: no model chunks");
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer: model chunk ", i, " is null"));
    }
  }
  if (executor == nullptr && chunks.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: ", chunks.size(),
        " model chunks need a pipeline executor to run them (without one, "
        "exactly one whole-model chunk)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> MeanOverGroup(double local, comm::ProcessGroup* group) {
  MCC_ASSIGN_OR_RETURN(std::vector<double> sum, SumOverGroup({local}, group));
  return sum[0] / GroupSize(group);
}

absl::StatusOr<EvalMetrics> Evaluate(const ModelChunks& chunks,
                                     pipeline::PipelineExecutor* executor,
                                     comm::ProcessGroup* dp_group,
                                     const std::vector<MicroBatch>& batches) {
  MCC_RETURN_IF_ERROR(CheckChunks(chunks, executor));
  double sum = 0, tokens = 0;
  if (executor != nullptr) {
    if (!batches.empty()) {
      MCC_ASSIGN_OR_RETURN(pipeline::PipelineStepResult run,
                           executor->Run(batches, 0.0f, /*forward_only=*/true));
      for (const LossSum& loss : run.losses) {
        sum += loss.sum;
        tokens += loss.tokens;
      }
    }
  } else {
    for (const MicroBatch& batch : batches) {
      MCC_ASSIGN_OR_RETURN(LossSum loss, Forward(chunks[0], batch));
      sum += loss.sum;
      tokens += loss.tokens;
    }
  }
  MCC_ASSIGN_OR_RETURN(std::vector<double> total,
                       SumOverGroup({sum, tokens}, dp_group));
  EvalMetrics m;
  m.sum = total[0];
  m.tokens = total[1];
  m.loss = m.tokens > 0 ? m.sum / m.tokens : 0.0;
  return m;
}

absl::StatusOr<std::unique_ptr<fsdp::FullyShardedDataParallel>>
WrapDataParallel(const ModelChunks& chunks, comm::ProcessGroup* dp,
                 fsdp::FsdpConfig config) {
  if (chunks.empty()) {
    return absl::InvalidArgumentError("data parallelism: no model chunks");
  }
  if (!fsdp::ShardsGradients(config.strategy)) {
    MCC_ASSIGN_OR_RETURN(auto wrapped, fsdp::FullyShardedDataParallel::Create(
                                           ChunkParameters(chunks), {}, dp,
                                           ChunkTensorGroup(chunks), config));
    SetGradReadyHook(chunks, wrapped->GradReadyHook());
    return wrapped;
  }
  if (chunks.size() != 1 || !chunks[0]->chunk().pre_process ||
      !chunks[0]->chunk().post_process) {
    return absl::UnimplementedError(absl::StrCat(
        "data-parallel sharding strategy ",
        fsdp::ShardingStrategyName(config.strategy),
        " does not run with pipeline parallelism yet; use optim or no_shard"));
  }
  return fsdp::FullyShardedDataParallel::Wrap(chunks[0], dp, config);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    TrainerParts parts, optim::LrSchedule schedule, TrainerOptions options) {
  MCC_RETURN_IF_ERROR(CheckChunks(parts.chunks, parts.executor));
  if (parts.optimizer == nullptr) {
    return absl::InvalidArgumentError("trainer: no optimizer");
  }
  if (parts.data_parallel != nullptr &&
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
  const TrainerParts& p = trainer->parts_;
  fsdp::FullyShardedDataParallel* dp = p.data_parallel;
  if (p.executor != nullptr && dp != nullptr) {
    // Data parallelism reduces only on each chunk's last micro-batch.
    p.executor->SetLastMicrobatchCallback(
        [dp](bool last) { dp->set_is_last_microbatch(last); });
  }
  // --overlap-param-gather: each unit waits for its own parameters' gather
  // just before its forward instead of all of them at the step's start.
  data_parallel::DistributedDataParallel* ddp =
      dp != nullptr ? dp->ddp() : nullptr;
  if (ddp != nullptr && ddp->config().overlap_param_gather &&
      ddp->config().use_distributed_optimizer) {
    for (ModelChunk* chunk : p.chunks) {
      trainer->gather_hooks_.push_back(
          std::make_unique<data_parallel::ParamGatherHooks>(
              ddp, ChunkUnits(*chunk)));
      SetUnitHooks(chunk, trainer->gather_hooks_.back().get());
    }
  }
  return trainer;
}

Trainer::Trainer(TrainerParts parts, optim::LrSchedule schedule,
                 TrainerOptions options)
    : parts_(std::move(parts)),
      schedule_(std::move(schedule)),
      options_(std::move(options)) {}

Trainer::~Trainer() {
  if (!gather_hooks_.empty()) {
    for (ModelChunk* chunk : parts_.chunks) SetUnitHooks(chunk, nullptr);
  }
  if (parts_.executor != nullptr && parts_.data_parallel != nullptr) {
    parts_.executor->SetLastMicrobatchCallback(nullptr);
  }
}

absl::Status Trainer::WaitForParameters() {
  if (parts_.data_parallel == nullptr) return absl::OkStatus();
  return parts_.data_parallel->FinishParamGather();
}

absl::Status Trainer::FinalizeModelGrads() {
  fsdp::FullyShardedDataParallel* dp = parts_.data_parallel;
  if (dp != nullptr) {
    // Gathers no unit's forward waited for (a stage without them).
    MCC_RETURN_IF_ERROR(dp->FinishParamGather());
    dp->set_is_last_microbatch(true);
  }
  MCC_RETURN_IF_ERROR(
      SyncSharedGradients(parts_.chunks, parts_.embedding_group));
  if (dp == nullptr) return FinalizeChunkGradients(parts_.chunks);
  MCC_RETURN_IF_ERROR(dp->FinishGradSync());
  // Replaces the model's: under the sharded strategies the gradients live
  // in the wrapper's shards.
  return dp->FinalizeGradients();
}

absl::StatusOr<StepMetrics> Trainer::Step(
    const std::vector<MicroBatch>& batches, int64_t iteration) {
  if (batches.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: iteration ", iteration, " has no micro-batches"));
  }
  StepMetrics m;
  m.iteration = iteration;
  m.num_microbatches = static_cast<int>(batches.size());
  fsdp::FullyShardedDataParallel* dp = parts_.data_parallel;
  if (dp != nullptr) {
    // The last step's updated parameters must be in place first (with the
    // gather hooks, each unit's just before its forward).
    if (gather_hooks_.empty()) MCC_RETURN_IF_ERROR(dp->FinishParamGather());
    dp->ZeroGrads();
  } else {
    ZeroChunkGradients(parts_.chunks);
  }
  // Each micro-batch's mean loss counts 1/M, times the loss scale.
  const float grad_scale =
      static_cast<float>(parts_.optimizer->loss_scale() / m.num_microbatches);
  double local_loss = 0, local_tokens = 0;
  absl::Time start = absl::Now();
  if (parts_.executor != nullptr) {
    MCC_ASSIGN_OR_RETURN(pipeline::PipelineStepResult run,
                         parts_.executor->Run(batches, grad_scale));
    for (const LossSum& loss : run.losses) {
      local_loss += loss.mean() / m.num_microbatches;
      local_tokens += loss.tokens;
    }
    m.pipeline = run.stats;
  } else {
    for (int i = 0; i < m.num_microbatches; ++i) {
      if (dp != nullptr)
        dp->set_is_last_microbatch(i == m.num_microbatches - 1);
      MCC_ASSIGN_OR_RETURN(
          LossSum loss,
          ForwardBackward(parts_.chunks[0], batches[i], grad_scale));
      local_loss += loss.mean() / m.num_microbatches;
      local_tokens += loss.tokens;
    }
  }
  m.forward_backward_seconds = SecondsSince(start);

  start = absl::Now();
  MCC_RETURN_IF_ERROR(FinalizeModelGrads());
  m.grad_sync_seconds = SecondsSince(start);
  if (options_.before_optimizer_step) {
    MCC_RETURN_IF_ERROR(options_.before_optimizer_step(iteration));
  }

  start = absl::Now();
  MCC_ASSIGN_OR_RETURN(
      optim::StepInfo info,
      parts_.optimizer->Step(schedule_.LearningRate(iteration)));
  m.optimizer_seconds = SecondsSince(start);
  m.lr = info.lr;
  m.grad_norm = info.grad_norm;
  m.skipped = info.skipped;
  m.loss_scale = info.loss_scale;

  MCC_ASSIGN_OR_RETURN(
      std::vector<double> total,
      SumOverGroup({local_loss, local_tokens}, parts_.dp_group));
  m.loss = total[0] / GroupSize(parts_.dp_group);
  m.loss_tokens = total[1];
  return m;
}

absl::StatusOr<EvalMetrics> Trainer::Evaluate(
    const std::vector<MicroBatch>& batches) {
  return training::Evaluate(parts_.chunks, parts_.executor, parts_.dp_group,
                            batches);
}

}  // namespace training
}  // namespace mcc
