#ifndef PARALLEL_PIPELINE_SCHEDULE_CHECK_H_
#define PARALLEL_PIPELINE_SCHEDULE_CHECK_H_

#include <vector>

#include "absl/status/statusor.h"
#include "parallel/pipeline/schedule_table.h"

namespace mcc {
namespace pipeline {

struct ScheduleCheck {
  // Per rank, the most (micro-batch, chunk) pairs whose activations it held
  // at once: from the end of their F to the end of their B, or of their W
  // when the table splits W off (the weight gradient still reads the
  // layer's inputs).
  std::vector<int> peak_held;
  // Rounds the simulation took: each round every rank runs its next row if
  // everything that row waits for finished in an earlier round.
  int rounds = 0;
};

// Checks that the table is well formed (CheckScheduleRows) and that it runs
// to the end without deadlock, where on virtual stage v (VirtualStage: chunk
// * ranks + rank, or the V's order): F waits for F of the same micro-batch on v
// - 1; B waits for F on v and B on v + 1; W waits for B on v. Sends never block
// (as the executor's). A table that stalls is refused naming the lowest stalled
// rank's next row and the first thing it waits for. With max_held > 0, a rank
// holding more than max_held activations at once is refused too.
absl::StatusOr<ScheduleCheck> CheckSchedule(const ScheduleTable& table,
                                            int max_held = 0);

}  // namespace pipeline
}  // namespace mcc

#endif  // PARALLEL_PIPELINE_SCHEDULE_CHECK_H_
