#ifndef CHECKPOINT_COMM_DIST_CONTEXT_H_
#define CHECKPOINT_COMM_DIST_CONTEXT_H_

#include "checkpoint/dist_context.h"
#include "core/comm/process_group.h"

namespace mcc {

// Checkpointing's collectives (all_gather, barrier, send_recv) over a
// process group; give checkpoints a group of their own, so an asynchronous
// save can run beside training's collectives. Null or a group of one: one
// process (DistContext::Single, without send_recv).
DistContext MakeProcessGroupDistContext(comm::ProcessGroup* group);

}  // namespace mcc

#endif  // CHECKPOINT_COMM_DIST_CONTEXT_H_
