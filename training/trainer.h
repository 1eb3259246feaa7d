#ifndef TRAINING_TRAINER_H_
#define TRAINING_TRAINER_H_

// One training step for every caller (tools/train, tools/eval, the tests and
// the benchmarks): the micro-batches' forwards and backwards (through the
// pipeline executor, which is a plain loop on one stage), the data-parallel
// gradient sync (DDP, the distributed optimizer, or FSDP's ZeRO-2/3), the
// finalisation of tied-embedding and sequence-parallel gradients, the loss
// scale, clipping and the optimizer step at the schedule's learning rate,
// and the step's metrics. Also evaluation (forward only over micro-batches).
//
// The trainer knows the model only through the model contract
// (parallel/model.h): parameters, units, hooks and gradient finalisation
// (parallel::Model), and pipeline stages that supply micro-batch i
// themselves (parallel::PipelineStage). The caller hands the step's
// micro-batches to its model (for the GPT, StageModel::SetMicroBatches)
// and tells the trainer how many there are. //training does not depend on
// //models.
//
// Ownership: a Trainer owns none of the objects in TrainerParts; each must
// outlive it. It installs on the executor, and removes again when
// destroyed, the last-micro-batch callback that tells data parallelism
// which micro-batch is the step's last.
//
// Collectives: Step, Evaluate and WaitForParameters are collective over the
// data-parallel group and, through the models, the executor and the
// optimizer, over the tensor-, pipeline- and embedding groups: every rank
// of those groups calls them in the same order, Step with the same
// iteration and micro-batch count. Create makes no collective call.
//
// Thread-safety: none. One thread drives a Trainer and the objects in its
// parts; no other thread may touch them during a call.
//
// Host synchronisation: the losses stay on the device (the executor totals
// them there, core/ops/loss_totals.h, and the data-parallel sum happens
// there), the optimizer's gradient statistics land beside them in one
// small device buffer, and Step reads both with exactly one device-to-host
// copy (none on the CPU), from which the optimizer clips or skips.
// Evaluate reads once per call likewise.
//
// Errors: a bad configuration fails Create with InvalidArgument naming the
// part at fault. An error from Step or Evaluate (a bad micro-batch, a
// collective that failed or timed out) is returned with the stage, rank or
// tensor the lower layer named; the step is then abandoned (gradients
// partial, collectives possibly in flight, the optimizer not stepped) and
// the only safe thing to do with the Trainer and its parts is to destroy
// them and report the error. A step skipped for inf or NaN gradients under
// loss scaling is not an error: StepMetrics::skipped says so and the loss
// scale has backed off.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/model.h"
#include "parallel/pipeline/pipeline_executor.h"

namespace mcc {
namespace training {

// What a Trainer drives. None is owned.
struct TrainerParts {
  // This rank's model chunks in order (the whole model, one pipeline stage,
  // or one chunk per virtual stage). Required.
  std::vector<parallel::Model*> models;
  // Runs the micro-batches through the chunks (any schedule, any number of
  // stages). Null: the trainer runs its own single-stage executor (no
  // pipelining: each micro-batch's forward, then its backward) over
  // `stages`.
  pipeline::PipelineExecutor* executor = nullptr;
  // The same chunks as pipeline stages; needed only without an executor.
  std::vector<parallel::PipelineStage*> stages;
  // Data parallelism over the models' parameters (WrapDataParallel: the
  // replicated or the sharded implementation). Null: gradients stay in the
  // models and are not reduced over any group.
  data_parallel::DataParallel* data_parallel = nullptr;
  // Steps the parameters (created over data_parallel when there is one).
  // Required.
  optim::Optimizer* optimizer = nullptr;
  // Losses are averaged over this group (null: this rank alone). It must be
  // data_parallel's group when both are given.
  comm::ProcessGroup* dp_group = nullptr;
  // Context parallelism (null or size 1: none). Every CP rank then reports
  // its micro-batches' whole loss (the model sums it over CP), so losses
  // still average over dp_group alone, while data_parallel reduces the
  // gradients over DP x CP (its group must have dp x cp ranks).
  comm::ProcessGroup* context_group = nullptr;
  // The first and last pipeline stages, over which a tied embedding /
  // output weight's two copies sum their gradients (null: none).
  comm::ProcessGroup* embedding_group = nullptr;
};

struct TrainerOptions {
  // Called in Step once the gradients are final (synced over DP, tied and
  // sequence-parallel ones summed) and before the optimizer step; an error
  // stops the step. For tests that inject faults or read traces.
  std::function<absl::Status(int64_t iteration)> before_optimizer_step;
  // The rerun check (train --rerun-mode validate_results). Called once the
  // step's loss and global gradient norm are known, before the optimizer
  // uses them: true reruns the step's micro-batches once from the same
  // state (gradients zeroed, before_rerun called first), and the optimizer
  // then applies the rerun's result. Every rank must answer alike (the
  // caller agrees over its groups); the answer may be a collective.
  std::function<absl::StatusOr<bool>(int64_t iteration, double loss,
                                     double grad_norm)>
      rerun_step_if;
  // Restores what a run advanced besides the gradients before the rerun
  // (for the GPT, the models' dropout counters), so the rerun computes what
  // the first run did unless something faulted.
  std::function<absl::Status()> before_rerun;
  // The learning-rate schedule's position for a step, in iterations of the
  // final global batch (optim::LrSchedule::LearningRateAt). Unset: the
  // iteration itself. Under a batch-size ramp the run gives the samples
  // consumed through the step over the final global batch, as Megatron's
  // scheduler counts samples.
  std::function<double(int64_t iteration)> schedule_position;
  // Keeps the MoE experts' weights packed for the CPU grouped GEMM over a
  // step's micro-batches (ops::ScopedExpertWeightPacking around the
  // forward and backward passes, ended before the optimizer step changes
  // them; --moe-pack-expert-weights).
  bool pack_expert_weights = false;
};

// What one step did. Every rank of the data-parallel group gets the same
// loss, loss_tokens, grad_norm, skipped and loss_scale.
struct StepMetrics {
  int64_t iteration = 0;
  // Megatron's loss: the mean over the global batch's micro-batches of each
  // one's mean loss per token (exact float64 on one rank; summed over DP as
  // fp32 hi/lo pairs, about 48 bits).
  double loss = 0;
  double loss_tokens = 0;    // Tokens the loss counts, over the global batch.
  int num_microbatches = 0;  // On this rank.
  double lr = 0;
  double grad_norm = 0;  // Global, unscaled, before clipping.
  // Zero gradient elements, global (optim::OptimizerConfig::
  // log_num_zeros_in_grad; else -1).
  int64_t num_zeros = -1;
  bool skipped = false;   // inf or NaN in the gradients: no update.
  double loss_scale = 1;  // In effect for this step.
  // Set when rerun_step_if asked for a rerun: the metrics are then the
  // rerun's; the caller compares them with what rerun_step_if was shown.
  bool rerun = false;
  // Wall-clock seconds on this rank: the micro-batches, the gradient sync
  // and finalisation, the optimizer step.
  double forward_backward_seconds = 0;
  double grad_sync_seconds = 0;
  double optimizer_seconds = 0;
  // This stage's schedule statistics.
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

  // One optimizer step over this rank's `num_microbatches` micro-batches
  // (its share of the global batch, which its models supply by index; every
  // pipeline stage runs the same count) at the learning rate of
  // `iteration` (counted from 1, as Megatron's). Gradients are zeroed
  // first, so each step starts clean. Collective (see above).
  absl::StatusOr<StepMetrics> Step(int num_microbatches, int64_t iteration);

  // Forward only over `num_microbatches` micro-batches (0 is allowed, on
  // every rank alike), no dropout, no gradients. Collective (see above).
  absl::StatusOr<EvalMetrics> Evaluate(int num_microbatches);

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
  // Without a given executor: the trainer's own, and parts_.executor.
  std::unique_ptr<pipeline::PipelineExecutor> own_executor_;
  // What a step reads to the host in its one copy (see trainer.cc), on the
  // optimizer's device; the gradient statistics view its first four
  // values. host_buffer_ receives the copy off the CPU.
  Tensor step_buffer_;
  Tensor grad_stats_;
  Tensor host_buffer_;
};

// Evaluation without a Trainer (tools/eval): forward only over
// `num_microbatches` micro-batches (which the executor's stages supply)
// through `executor`, the loss summed over `dp_group` (may be null).
// Collective as Trainer::Evaluate.
absl::StatusOr<EvalMetrics> Evaluate(pipeline::PipelineExecutor* executor,
                                     comm::ProcessGroup* dp_group,
                                     int num_microbatches);

// Data parallelism over the models by config.strategy: no_shard and optim
// by the replicated implementation (Megatron's DDP; optim: with the
// distributed optimizer), its hooks added on every model; optim_grads and
// optim_grads_params by one sharded wrapper over every chunk's units (one
// pipeline stage or several virtual stages: see
// parallel/fsdp/fully_sharded_data_parallel.h). dp and pipeline may be null;
// pipeline is not needed by either implementation (kept for callers). The
// models must outlive the result.
absl::StatusOr<std::unique_ptr<data_parallel::DataParallel>> WrapDataParallel(
    const std::vector<parallel::Model*>& models, comm::ProcessGroup* dp,
    comm::ProcessGroup* pipeline, fsdp::FsdpConfig config);

// A list of chunks of a model type as the contract's models.
template <typename Chunk>
std::vector<parallel::Model*> AsModels(const std::vector<Chunk*>& chunks) {
  return std::vector<parallel::Model*>(chunks.begin(), chunks.end());
}

// The mean of `local` over `group` (null or size 1: local itself), kept to
// about fp64 precision (an fp64 value travels as two fp32 halves).
// Collective over group.
absl::StatusOr<double> MeanOverGroup(double local, comm::ProcessGroup* group);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_TRAINER_H_
