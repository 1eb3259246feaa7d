#ifndef PARALLEL_PIPELINE_SCHEDULE_CSV_H_
#define PARALLEL_PIPELINE_SCHEDULE_CSV_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "parallel/pipeline/schedule_table.h"

namespace mcc {
namespace pipeline {

// Reads a schedule table from CSV text: the header line
// `rank,step,microbatch,chunk,op`, then one row per line with decimal
// non-negative integers and op F, B or W. Every byte is untrusted: a bad
// number, an unknown op, a field out of the shape's range, a repeated row or
// step, or a missing row is an error naming the line (or the missing row).
// Blank lines and a trailing '\r' are ignored.
absl::StatusOr<ScheduleTable> ReadScheduleCsv(absl::string_view text,
                                              const ScheduleShape& shape);

// The table as CSV, in the format ReadScheduleCsv reads.
std::string WriteScheduleCsv(const ScheduleTable& table);

}  // namespace pipeline
}  // namespace mcc

#endif  // PARALLEL_PIPELINE_SCHEDULE_CSV_H_
