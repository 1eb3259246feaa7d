#ifndef PARALLEL_PIPELINE_PIPELINE_EXECUTOR_H_
#define PARALLEL_PIPELINE_PIPELINE_EXECUTOR_H_

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "parallel/model.h"
#include "parallel/pipeline/p2p.h"
#include "parallel/pipeline/schedule_table.h"
#include "parallel/pipeline/schedules.h"

namespace mcc {
namespace pipeline {

struct PipelineOptions {
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  // Let batches that only send complete in the background, waiting for
  // each where it has provably finished (Megatron's overlapped p2p);
  // --no-overlap-p2p-communication turns it off: every batch of sends and
  // receives (p2p.h, PlanTransfers) is waited for as soon as it is posted.
  // Either way each unit's results and the next unit's inputs move in one
  // batch, posted after the unit, with no tags (NCCL ignores them).
  bool overlap_p2p = true;
  // A schedule to run instead of `schedule`'s (--pipeline-schedule-file),
  // for one shape: the pipeline size, this stage's chunk count and the
  // step's micro-batch count must be its own. Before its first run it is
  // checked (CheckSchedule) with a bound on held activations per rank:
  // table_max_held, or when 0 the busiest rank's under 1F1B (interleaved
  // with several chunks) of that shape. Null: the table of `schedule`.
  std::shared_ptr<const ScheduleTable> table;
  int table_max_held = 0;
};

// What one step did on this stage.
struct PipelineStats {
  double forward_seconds = 0;   // Computing forwards.
  double backward_seconds = 0;  // Computing backwards (B and W).
  double weight_seconds = 0;    // Of which split-off weight gradients (W).
  double wait_seconds = 0;      // Blocked on neighbours' transfers.
  double total_seconds = 0;     // The whole schedule.
  // Most micro-batches whose activations this stage held at once (until
  // their weight gradient when the schedule splits it off).
  int max_in_flight = 0;
  // Most forward outputs this stage held at once after sending them
  // (overlapped p2p; each is released at its micro-batch's backward).
  int max_held_outputs = 0;
  // Share of the step this stage did not compute, and the schedule's
  // theoretical bubble (TheoreticalBubble).
  double measured_bubble = 0;
  double theoretical_bubble = 0;
};

struct PipelineStepResult {
  // The step's loss totals (core/ops/loss_totals.h: the mean over
  // micro-batches of each one's mean loss, the summed loss and the token
  // count, each an exact float64 in three fp32 parts), totalled on the
  // loss stage's (the last; stage 0 under ZB-V) device and broadcast to every
  // stage over the pipeline group: an fp32 [ops::kLossTotalsSize] tensor on the
  // pipeline group's device (with one stage, on the loss's device, or zeros on
  // the CPU without micro-batches). Nothing is read to the host.
  Tensor loss_totals;
  // Each micro-batch's StageOutput::loss_sum, on the stage that computes
  // the loss (the last, or stage 0 under ZB-V; empty on the others), for
  // tests that look at one.
  std::vector<Tensor> microbatch_losses;
  PipelineStats stats;
};

// Runs a pipeline schedule over this stage's model chunks (one, or one per
// virtual stage in order; see parallel::PipelineStage), moving activations
// and gradients between neighbouring stages in buffers shaped, typed and
// placed as the chunks' InputSpec / OutputSpec say. The chunks' parameter
// gradients accumulate grad_scale * d(mean loss)/d(param) per micro-batch;
// the caller then sums shared gradients (Model::SyncSharedGradients) and
// syncs data parallelism. The executor does not own the chunks. Run is
// collective over the pipeline group; after an error the step is
// abandoned (see parallel/model.h).
class PipelineExecutor {
 public:
  // pipeline may be null for a single stage.
  static absl::StatusOr<std::unique_ptr<PipelineExecutor>> Create(
      std::vector<parallel::PipelineStage*> chunks,
      comm::ProcessGroup* pipeline, PipelineOptions options);

  // Called before each backward, and before each split-off weight gradient,
  // with whether it is the chunk's last micro-batch of the step (data
  // parallelism reduces only then; the schedule ends each chunk's gradients
  // with that micro-batch's).
  void SetLastMicrobatchCallback(std::function<void(bool)> callback) {
    last_microbatch_ = std::move(callback);
  }

  // One step over micro-batches 0 ... num_microbatches - 1, which the
  // chunks supply by index (every stage runs the same count). grad_scale as
  // PipelineStage::BackwardStep's. forward_only: evaluation, no dropout.
  absl::StatusOr<PipelineStepResult> Run(int num_microbatches, float grad_scale,
                                         bool forward_only = false);

  int stages() const { return stages_; }
  int stage() const { return stage_; }
  const PipelineOptions& options() const { return options_; }

 private:
  PipelineExecutor() = default;
  // Sends the last stage's loss totals to every stage (collective over the
  // pipeline group).
  absl::Status BroadcastLossTotals(Tensor* totals);
  // This stage's actions for a training step of m micro-batches: the rows of
  // options_.table or of `kind`'s table, checked once per m.
  absl::StatusOr<std::vector<Action>> TrainingActions(ScheduleKind kind, int m);

  std::vector<parallel::PipelineStage*> chunks_;
  comm::ProcessGroup* pipeline_ = nullptr;
  std::unique_ptr<PipelineP2P> p2p_;
  PipelineOptions options_;
  int stages_ = 1, stage_ = 0;
  int loss_stage_ = 0;  // Holds the last virtual stage (computes the loss).
  std::function<void(bool)> last_microbatch_;
  std::map<int, std::vector<Action>> checked_actions_;  // By micro-batches.
  // V-shaped: every stage's actions, by micro-batches.
  std::map<int, std::vector<std::vector<Action>>> stage_actions_;
};

}  // namespace pipeline
}  // namespace mcc

#endif  // PARALLEL_PIPELINE_PIPELINE_EXECUTOR_H_
