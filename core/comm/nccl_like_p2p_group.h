#ifndef CORE_COMM_NCCL_LIKE_P2P_GROUP_H_
#define CORE_COMM_NCCL_LIKE_P2P_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/comm/serial_queue.h"

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
// forwarded to `inner`, which must outlive this group.
class NcclLikeP2PGroup : public ProcessGroup {
 public:
  explicit NcclLikeP2PGroup(ProcessGroup* inner);
  ~NcclLikeP2PGroup() override;

  absl::string_view backend() const override { return backend_; }
  Device device() const override { return inner_->device(); }

 protected:
  std::shared_ptr<Work> DoAllReduce(const Call& call, Tensor t,
                                    ReduceOp op) override;
  std::shared_ptr<Work> DoAllGather(const Call& call, Tensor in,
                                    Tensor out) override;
  std::shared_ptr<Work> DoAllGatherV(
      const Call& call, Tensor in, Tensor out,
      std::vector<int64_t> elements_per_rank) override;
  std::shared_ptr<Work> DoReduceScatter(const Call& call, Tensor in, Tensor out,
                                        ReduceOp op) override;
  std::shared_ptr<Work> DoBroadcast(const Call& call, Tensor t,
                                    int root) override;
  std::shared_ptr<Work> DoAllToAll(const Call& call, Tensor in,
                                   Tensor out) override;
  std::shared_ptr<Work> DoBarrier(const Call& call) override;
  std::shared_ptr<Work> DoSend(const Call& call, Tensor t, int dst,
                               uint32_t tag) override;
  std::shared_ptr<Work> DoRecv(const Call& call, Tensor t, int src,
                               uint32_t tag) override;
  std::shared_ptr<Work> DoBatchP2P(const Call& call,
                                   std::vector<P2POp> ops) override;
  absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateSubgroup(
      int rank, int size, std::string name, std::vector<int> global_ranks,
      std::shared_ptr<Store> store, GroupOptions options) override;

 private:
  // Runs fn on the serial worker after everything posted before it; the
  // work finishes with fn's status.
  std::shared_ptr<Work> Serialized(const Call& call,
                                   std::function<absl::Status()> fn);
  // The transfers of one batch over the inner group, with rendezvous.
  absl::Status RunTransfers(const Call& call, const std::vector<P2POp>& ops);

  ProcessGroup* inner_;
  std::string backend_;
  std::unique_ptr<SerialQueue> queue_;
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_NCCL_LIKE_P2P_GROUP_H_
