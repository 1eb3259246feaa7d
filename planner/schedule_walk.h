#ifndef PLANNER_SCHEDULE_WALK_H_
#define PLANNER_SCHEDULE_WALK_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt/gpt_config.h"
#include "parallel/pipeline/schedule_table.h"
#include "planner/job_spec.h"
#include "planner/layout.h"

namespace mcc {
namespace planner {

// The table the pipeline executor runs for `layout` over `microbatches`
// micro-batches, from parallel/pipeline's own builders (as train's
// PipelineOptionsFromConfig chooses): no pipelining on one stage, 1F1B or
// interleaved 1F1B by the virtual stages, ZB-H1, or the job's
// --pipeline-schedule-file table, whose shape must be the layout's. The
// planner's memory and bubble walk these rows, so a schedule the executor
// can run needs no model of its own here.
absl::StatusOr<pipeline::ScheduleTable> LayoutScheduleTable(
    const JobSpec& job, const Layout& layout, int microbatches);

// Rank `rank`'s rows of LayoutScheduleTable, in the order it runs them,
// built for that rank alone (parallel/pipeline's BuildSchedule; the file's
// rows), so a large shape costs one rank's rows.
absl::StatusOr<std::vector<pipeline::ScheduleRow>> LayoutRankRows(
    const JobSpec& job, const Layout& layout, int microbatches, int rank);

// Whether the layout's schedule splits the backward into B and W.
bool LayoutSplitsBackward(const JobSpec& job, const Layout& layout);

// `rank`'s rows in the order it runs them.
std::vector<pipeline::ScheduleRow> RowsOfRank(
    const pipeline::ScheduleTable& table, int rank);

// Whether the table splits the backward into B and W rows.
bool SplitsBackward(const pipeline::ScheduleTable& table);

// The virtual stage (model chunk, in layer order) rank `rank`'s chunk
// `chunk` runs: chunk x ranks + rank, or in a V-shaped table (ZB-V) odd
// chunks the other way, the tables' convention (schedule_table.h).
int VirtualStageOf(const pipeline::ScheduleShape& shape, int rank, int chunk);

// Seconds from the first row's start to the last row's end when each row
// takes `seconds(row)` and waits, as the executor's ranks do, for what it
// depends on (schedule_check.h: F for F on the virtual stage before, B for
// F here and B on the stage after, W for B here), transfers free. The error
// names a row that can never start.
absl::StatusOr<double> SimulateStepSeconds(
    const pipeline::ScheduleTable& table,
    const std::function<double(const pipeline::ScheduleRow&)>& seconds);

// What a pipeline stage's work costs per micro-batch, forward and backward:
// a decoder layer, the output layer and loss, the embedding; of the first
// two, the weight-gradient step W of a schedule that splits the backward.
struct PipelineWork {
  double layer = 0;
  double layer_weight = 0;
  double head = 0;
  double head_weight = 0;
  double embedding = 0;
};

// One micro-batch's forward and backward seconds on each (rank, chunk), and
// of them the W step: the chunk's layers (the layout's split,
// planner/stage_layers.h), the embedding on virtual stage 0 and the output
// layer on the last virtual stage (stage 0's second chunk under ZB-V).
struct ChunkSeconds {
  std::vector<std::vector<double>> total;   // [rank][chunk]
  std::vector<std::vector<double>> weight;  // [rank][chunk]
};
ChunkSeconds ChunkSecondsOf(const gpt::GPTConfig& model, const Layout& layout,
                            const PipelineWork& work);

// SimulateStepSeconds with each row taking its (rank, chunk)'s time: a
// forward a third of it, W its weight share, B the rest. The error names a
// row that can never start or a (rank, chunk) `seconds` lacks.
absl::StatusOr<double> WalkStepSeconds(const pipeline::ScheduleTable& table,
                                       const ChunkSeconds& seconds);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_SCHEDULE_WALK_H_
