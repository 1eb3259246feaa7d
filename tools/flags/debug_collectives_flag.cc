#include "tools/flags/debug_collectives_flag.h"

#include "absl/flags/flag.h"
#include "core/comm/process_group.h"

ABSL_FLAG(bool, debug_collectives, false,
          "Check before every collective that all ranks of the group make "
          "the same call (operation, dtype, element count, root, rank list); "
          "also set by MCC_DEBUG_COLLECTIVES=1.");

namespace mcc {
namespace flags {

void ApplyDebugCollectivesFlag() {
  comm::SetDebugCollectivesDefault(absl::GetFlag(FLAGS_debug_collectives));
}

}  // namespace flags
}  // namespace mcc
