#ifndef CORE_COMM_HANG_ANALYSIS_H_
#define CORE_COMM_HANG_ANALYSIS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mcc {
namespace comm {

// Reads the ranks' flight-recorder dumps (FlightRecorder::Dump) and says
// who is behind: for each group where some ranks wait in a collective, which
// ranks wait, and for each member that never reached it, the last sequence
// number it finished and the call it is in (or that it left no dump: it was
// stopped, killed, or hangs outside any collective). Ranks that called
// different collectives at the same sequence number are named too.
//
// `dumps` maps a label (the file name) to the dump's JSON text.
// `world_size` (0: unknown) adds ranks that appear in no group's dump.
// Returns one finding per line, most useful first; an error names the
// dump that cannot be read.
absl::StatusOr<std::vector<std::string>> AnalyzeHang(
    const std::map<std::string, std::string>& dumps, int world_size = 0);

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_HANG_ANALYSIS_H_
