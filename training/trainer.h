#ifndef TRAINING_TRAINER_H_
#define TRAINING_TRAINER_H_

// One training step for every caller (tools/train, tools/eval, the tests and
// the benchmarks): the micro-batches' forwards and backwards (through the
// pipeline executor, or one after another through a single chunk), the
// data-parallel gradient sync (DDP, the distributed optimizer, or FSDP's
// ZeRO-2/3), the finalisation of tied-embedding and sequence-parallel
// gradients, the loss scale, clipping and the optimizer step at the
// schedule's learning rate, and the step's metrics. Also evaluation (forward
// only over micro-batches).
//
// Ownership: a Trainer owns none of the objects in TrainerParts; each must
// outlive it. It installs on them, and removes again when destroyed, the
// executor's last-micro-batch callback and (with the distributed
// optimizer's --overlap-param-gather) per-unit parameter-gather hooks on the
// chunks.
//
// Collectives: Step, Evaluate and WaitForParameters are collective over the
// data-parallel group and, through the model and the optimizer, over the
// tensor-, pipeline- and embedding groups: every rank of those groups calls
// them in the same order, Step with the same iteration and the same number
// of micro-batches. Create makes no collective call.
//
// Thread-safety: none. One thread drives a Trainer and the objects in its
// parts; no other thread may touch them during a call.
//
// Errors: a bad configuration fails Create with InvalidArgument naming the
// part at fault. An error from Step or Evaluate (a bad micro-batch, a
// collective that failed or timed out) is returned with the stage, rank or
// tensor the lower layer named; the step is then incomplete (gradients
// partial, collectives possibly in flight, the optimizer not stepped) and
// the only safe thing to do with the Trainer and its parts is to destroy
// them. A step skipped for inf or NaN gradients under loss scaling is not an
// error: StepMetrics::skipped says so and the loss scale has backed off.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/param_gather_hooks.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "training/model_chunks.h"

namespace mcc {
namespace training {

// What a Trainer drives. None is owned.
struct TrainerParts {
  // This rank's model chunks in order (see model_chunks.h). Required.
  ModelChunks chunks;
  // Runs the micro-batches through the chunks (any schedule, any number of
  // stages). Null: exactly one chunk, holding the whole model, runs each
  // micro-batch's forward and backward in turn.
  pipeline::PipelineExecutor* executor = nullptr;
  // Data parallelism over the chunks' parameters (WrapDataParallel). Null:
  // gradients stay in the model and are not reduced over any group.
  fsdp::FullyShardedDataParallel* data_parallel = nullptr;
  // Steps the parameters (created over data_parallel when there is one).
  // Required for Step; Evaluate needs none.
  optim::Optimizer* optimizer = nullptr;
  // Losses are averaged over this group (null: this rank alone). It must be
  // data_parallel's group when both are given.
  comm::ProcessGroup* dp_group = nullptr;
  // The first and last pipeline stages, over which a tied embedding /
  // output weight's two copies sum their gradients (null: none).
  comm::ProcessGroup* embedding_group = nullptr;
};

struct TrainerOptions {
  // Called in Step once the gradients are final (synced over DP, tied and
  // sequence-parallel ones summed) and before the optimizer step; an error
  // stops the step. For tests that inject faults or read traces.
  std::function<absl::Status(int64_t iteration)> before_optimizer_step;
};

// What one step did. Every rank of the data-parallel group gets the same
// loss, loss_tokens, grad_norm, skipped and loss_scale.
struct StepMetrics {
  int64_t iteration = 0;
  // Megatron's loss: the mean over the global batch's micro-batches of each
  // one's mean loss per token (summed over DP in about fp64 precision).
  double loss = 0;
  double loss_tokens = 0;    // Tokens the loss counts, over the global batch.
  int num_microbatches = 0;  // On this rank.
  double lr = 0;
  double grad_norm = 0;   // Global, unscaled, before clipping.
  bool skipped = false;   // inf or NaN in the gradients: no update.
  double loss_scale = 1;  // In effect for this step.
  // Wall-clock seconds on this rank: the micro-batches, the gradient sync
  // and finalisation, the optimizer step.
  double forward_backward_seconds = 0;
  double grad_sync_seconds = 0;
  double optimizer_seconds = 0;
  // This stage's schedule statistics (zero without an executor).
  pipeline::PipelineStats pipeline;
};

// The mean loss per token of a split, over every rank's micro-batches.
struct EvalMetrics {
  double loss = 0;    // sum / tokens (0 without tokens).
  double sum = 0;     // Summed over the data-parallel group.
  double tokens = 0;  // Summed over the data-parallel group.
};

class Trainer {
 public:
  // Checks the parts and installs the hooks described above.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      TrainerParts parts, optim::LrSchedule schedule,
      TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step over this rank's micro-batches (its share of the
  // global batch; every pipeline stage passes the same ones) at the
  // learning rate of `iteration` (counted from 1, as Megatron's). Gradients
  // are zeroed first, so each step starts clean. Collective (see above).
  absl::StatusOr<StepMetrics> Step(const std::vector<MicroBatch>& batches,
                                   int64_t iteration);

  // Forward only over `batches` (may be empty on every rank), no dropout, no
  // gradients. Collective (see above).
  absl::StatusOr<EvalMetrics> Evaluate(const std::vector<MicroBatch>& batches);

  // Waits until the parameters the last step updated are in place (the
  // distributed optimizer's all-gathers), before code that reads them.
  absl::Status WaitForParameters();

  const TrainerParts& parts() const { return parts_; }
  const optim::LrSchedule& schedule() const { return schedule_; }

 private:
  Trainer(TrainerParts parts, optim::LrSchedule schedule,
          TrainerOptions options);
  // Megatron's finalize_model_grads, in the one place it happens: the tied
  // embedding's copies summed (and reported ready), the data-parallel sync,
  // then the sequence-parallel gradients summed over TP.
  absl::Status FinalizeModelGrads();

  TrainerParts parts_;
  optim::LrSchedule schedule_;
  TrainerOptions options_;
  std::vector<std::unique_ptr<data_parallel::ParamGatherHooks>> gather_hooks_;
};

// Evaluation without a Trainer (tools/eval): forward only over `batches`
// through `executor`, or, when it is null, through the single whole-model
// chunk; the loss summed over `dp_group` (may be null). Collective as
// Trainer::Evaluate.
absl::StatusOr<EvalMetrics> Evaluate(const ModelChunks& chunks,
                                     pipeline::PipelineExecutor* executor,
                                     comm::ProcessGroup* dp_group,
                                     const std::vector<MicroBatch>& batches);

// Data parallelism over the chunks by config.strategy: no_shard and optim
// as Megatron's DDP (optim: with the distributed optimizer), its grad-ready
// hook installed on every chunk; optim_grads and optim_grads_params wrap the
// single chunk's units (not yet with more than one chunk: Unimplemented).
// dp may be null (DP 1). The result must outlive the chunks' use of it.
absl::StatusOr<std::unique_ptr<fsdp::FullyShardedDataParallel>>
WrapDataParallel(const ModelChunks& chunks, comm::ProcessGroup* dp,
                 fsdp::FsdpConfig config);

// The mean of `local` over `group` (null or size 1: local itself), kept to
// about fp64 precision (an fp64 value travels as two fp32 halves).
// Collective over group.
absl::StatusOr<double> MeanOverGroup(double local, comm::ProcessGroup* group);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_TRAINER_H_
