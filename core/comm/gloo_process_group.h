#ifndef CORE_COMM_GLOO_PROCESS_GROUP_H_
#define CORE_COMM_GLOO_PROCESS_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/comm/store.h"

namespace mcc {
namespace comm {

// Collectives on CPU tensors through gloo's TCP transport.
//
// Collectives run in order on one worker thread per group; point-to-point
// transfers are posted at once from the calling thread and completed by
// Work::Wait on the waiting thread (sends and receives of any tags may be
// waited for in any order); BatchP2P posts all of its transfers at once and
// completes when all have (Backend's default). 16-bit floating types
// (bf16, fp16) are reduced in fp32: the values are widened to fp32, reduced
// (all-reduce: gloo's ring; reduce-scatter: our own ring over gloo's unbound
// buffers), then rounded back to 16 bits once, so the result is the fp32
// reduction rounded to nearest even. Average is the sum divided by the group
// size (integers: truncated).
//
// The transport binds to GLOO_SOCKET_IFNAME when set, to 127.0.0.1 when
// MASTER_ADDR is a loopback address or unset, else to this host's name.
//
// Connects the ranks through `store` (keys prefixed per group) and returns
// this rank's group. It moves tensors on options.device: the CPU, or the
// host-backed test device, whose tensors gloo moves through their host views
// as NCCL moves GPU memory.
absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateGlooProcessGroup(
    std::shared_ptr<Store> store, int rank, int size, std::string name,
    std::vector<int> global_ranks, GroupOptions options);

namespace internal {

// Runs `hook` on the connecting thread before gloo connects each group
// created after this call (empty: none), and returns the hook it replaces.
// For tests of a connection that never returns.
std::function<void()> SetGlooConnectHookForTesting(std::function<void()> hook);

}  // namespace internal
}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_GLOO_PROCESS_GROUP_H_
