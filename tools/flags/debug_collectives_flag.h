#ifndef TOOLS_FLAGS_DEBUG_COLLECTIVES_FLAG_H_
#define TOOLS_FLAGS_DEBUG_COLLECTIVES_FLAG_H_

// --debug-collectives, for every binary that forms process groups
// (core/comm/process_group.h takes it through SetDebugCollectivesDefault).

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(bool, debug_collectives);

namespace mcc {
namespace flags {

// Hands --debug-collectives to the process groups; call from main after the
// flags are parsed, before any group is created.
void ApplyDebugCollectivesFlag();

}  // namespace flags
}  // namespace mcc

#endif  // TOOLS_FLAGS_DEBUG_COLLECTIVES_FLAG_H_
