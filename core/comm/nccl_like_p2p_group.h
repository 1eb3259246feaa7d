#ifndef CORE_COMM_NCCL_LIKE_P2P_GROUP_H_
#define CORE_COMM_NCCL_LIKE_P2P_GROUP_H_

#include <memory>

#include "core/comm/process_group.h"

namespace mcc {
namespace comm {

// A test wrapper that gives a gloo group NCCL's point-to-point semantics, so
// that code meant for NCCL (the pipeline executor) is proven on the CPU:
//  - tags are ignored: transfers from one rank to another match the other's
//    receives in posting order (one channel per direction and peer);
//  - every operation (Send, Recv, BatchP2P, collectives) runs in posting
//    order, one after the other, as on one NCCL stream: an operation starts
//    only once the one posted before it has finished;
//  - a send finishes only once the peer has received it (rendezvous, NCCL's
//    worst case), and a batch once all of its transfers have.
// So an order of posts that could deadlock or mismatch over NCCL does so
// here too (a deadlock ends in the operation's timeout). Operations are
// forwarded to `inner`, which must outlive the group returned.
std::unique_ptr<ProcessGroup> MakeNcclLikeP2PGroup(ProcessGroup* inner);

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_NCCL_LIKE_P2P_GROUP_H_
