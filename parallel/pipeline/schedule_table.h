#ifndef PARALLEL_PIPELINE_SCHEDULE_TABLE_H_
#define PARALLEL_PIPELINE_SCHEDULE_TABLE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "parallel/pipeline/schedules.h"

namespace mcc {
namespace pipeline {

// A pipeline schedule as data: which rank runs which operation at which
// step. Chunk c on rank r is virtual stage c * ranks + r (Megatron's model
// chunk order), so the forward of chunk c on the last rank feeds chunk c + 1
// on rank 0; in a V-shaped table (ZB-V) odd chunks run the other way (chunk
// 1 on rank r is virtual stage 2 * ranks - 1 - r), so the last rank's chunk
// 0 feeds its own chunk 1.
enum class ScheduleOp {
  kForward,   // F
  kBackward,  // B: the input gradient (the whole backward without W rows).
  kWeight,    // W: the weight gradient, split from B (zero-bubble style).
};
char ScheduleOpLetter(ScheduleOp op);

struct ScheduleRow {
  int rank = 0;
  int step = 0;
  int microbatch = 0;
  int chunk = 0;
  ScheduleOp op = ScheduleOp::kForward;
  int line = 0;  // Line of the CSV file it came from; 0 when generated.
};
// "rank 1 step 3: B micro-batch 2 chunk 0 (line 7)".
std::string ScheduleRowString(const ScheduleRow& row);

struct ScheduleShape {
  int ranks = 1;
  int chunks = 1;  // Model chunks (virtual stages) per rank.
  int microbatches = 1;
  bool v_shape = false;  // Chunks placed in a V (VirtualStage).
};

struct ScheduleTable {
  ScheduleShape shape;
  std::vector<ScheduleRow> rows;
};

// The shape is positive and small enough to simulate (at most 2^20
// (rank, chunk, micro-batch) cells).
absl::Status CheckScheduleShape(const ScheduleShape& shape);

// The table's rows are well formed: every field in range, each rank's steps
// run 0, 1, 2, ... without gaps or repeats, and every (rank, chunk,
// micro-batch) has exactly one F and one B, and one W if any row is a W.
// Errors name the offending row (with its line) or the missing one.
absl::Status CheckScheduleRows(const ScheduleTable& table);

// The table of the order the executor runs today: BuildSchedule's actions for
// every rank, step = position in that rank's list (V-shaped for ZB-V).
absl::StatusOr<ScheduleTable> GenerateScheduleTable(ScheduleKind kind,
                                                    const ScheduleShape& shape);

}  // namespace pipeline
}  // namespace mcc

#endif  // PARALLEL_PIPELINE_SCHEDULE_TABLE_H_
