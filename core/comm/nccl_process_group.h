#ifndef CORE_COMM_NCCL_PROCESS_GROUP_H_
#define CORE_COMM_NCCL_PROCESS_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/comm/store.h"

namespace mcc {
namespace comm {

// Collectives on CUDA tensors through NCCL: one communicator per group (its
// unique id exchanged through the store) and one communication stream of
// its own, so that communication overlaps compute as in PyTorch.
//
// Stream order: each operation waits (an event) for the work queued so far
// on the calling thread's current stream (core/cuda/stream.h), then runs on
// the group's stream, followed by a completion event. Work::Wait makes the
// waiting thread's current stream wait for that event and returns without
// blocking the host (GroupOptions::blocking_wait: it blocks until the
// operation has finished instead). Tensors stay referenced until the
// operation has finished, so the caching allocator cannot hand their memory
// to other work meanwhile.
//
// Failures: a watchdog thread per group polls the completion events and
// ncclCommGetAsyncError. An operation that passes its timeout, or an
// asynchronous NCCL error, aborts the communicator (ncclCommAbort), fails
// that operation with its name, group, rank and sequence number (as the
// gloo group does), logs it, and breaks the group: every later call and
// every pending work fails with that error. Errors from creating, recording
// or waiting for events fail the operation the same way.
//
// Send and Recv match in order per peer: NCCL ignores the tag. BatchP2P runs
// its transfers inside one ncclGroupStart/End. Reductions of bf16 and fp16
// run in NCCL's own kernels. Calls leave the current device as they found
// it.
//
// Creates this rank's group on CUDA device `device` (typically LOCAL_RANK):
// the communicator's unique id travels through `store` (keys prefixed per
// group).
absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateNcclProcessGroup(
    std::shared_ptr<Store> store, int rank, int size, std::string name,
    std::vector<int> global_ranks, GroupOptions options, int device);

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_NCCL_PROCESS_GROUP_H_
