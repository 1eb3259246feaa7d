#ifndef TRAINING_COMM_DIST_CONTEXT_H_
#define TRAINING_COMM_DIST_CONTEXT_H_

#include "checkpoint/dist_context.h"
#include "core/comm/process_group.h"

namespace mcc {
namespace training {

// Checkpointing's collectives over a process group (its own group, so an
// asynchronous save can run beside training's collectives). Null: one
// process.
DistContext MakeDistContext(comm::ProcessGroup* group);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_COMM_DIST_CONTEXT_H_
