#ifndef TOOLS_FLAGS_RUNTIME_FLAGS_H_
#define TOOLS_FLAGS_RUNTIME_FLAGS_H_

// The flags of the runtime under every binary that runs kernels and forms
// process groups (train, eval, serve, plan): --num-threads and
// --debug-collectives.

#include "tools/flags/debug_collectives_flag.h"
#include "tools/flags/num_threads_flag.h"

namespace mcc {
namespace flags {

// Hands both to the libraries; call from main right after the flags are
// parsed.
inline void ApplyRuntimeFlags() {
  ApplyNumThreadsFlag();
  ApplyDebugCollectivesFlag();
}

}  // namespace flags
}  // namespace mcc

#endif  // TOOLS_FLAGS_RUNTIME_FLAGS_H_
