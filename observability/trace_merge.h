#ifndef OBSERVABILITY_TRACE_MERGE_H_
#define OBSERVABILITY_TRACE_MERGE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mcc {
namespace observability {

// Merges per-rank Chrome traces written by TraceRecorder into one trace with
// a process (track group) per rank.
//
// Each rank's clock is shifted so that its clock-sync mark (the moment it
// left the start barrier) coincides with the first rank's, and times then
// start at zero. A trace without a mark is an error naming its file: merged
// unaligned, the ranks' steady clocks would be unrelated.
// `names` label the inputs in errors (file names).
absl::StatusOr<std::string> MergeChromeTraces(
    const std::vector<std::string>& traces,
    const std::vector<std::string>& names);

}  // namespace observability
}  // namespace mcc

#endif  // OBSERVABILITY_TRACE_MERGE_H_
