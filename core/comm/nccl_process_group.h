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
// unique id exchanged through the store), one stream of its own per group.
// Each operation first waits for work already queued on the device's
// legacy default stream, then runs on the group's stream; its Work completes
// when the stream reaches it. A Wait that passes the operation's timeout, or
// an asynchronous NCCL error, aborts the communicator (ncclCommAbort) and
// fails with the operation, group, rank and sequence number. Send and Recv
// match in order per peer (the tag is recorded but NCCL does not match on
// it). Reductions of bf16 and fp16 run in NCCL's own kernels.
class NcclProcessGroup : public ProcessGroup {
 public:
  // `device` is this rank's CUDA device index (typically LOCAL_RANK).
  static absl::StatusOr<std::shared_ptr<NcclProcessGroup>> Create(
      std::shared_ptr<Store> store, int rank, int size, std::string name,
      std::vector<int> global_ranks, GroupOptions options, int device);
  ~NcclProcessGroup() override;

  absl::string_view backend() const override { return "nccl"; }
  Device device() const override { return Device::CUDA(device_); }

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
  absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateSubgroup(
      int rank, int size, std::string name, std::vector<int> global_ranks,
      std::shared_ptr<Store> store, GroupOptions options) override;

 private:
  struct State;
  NcclProcessGroup(int rank, int size, std::string name,
                   std::vector<int> global_ranks, std::shared_ptr<Store> store,
                   GroupOptions options, int device);
  // Runs enqueue (NCCL calls on the group's stream) and returns a Work that
  // completes with the stream. `keep` holds tensors alive until then.
  std::shared_ptr<Work> Launch(const Call& call,
                               const std::function<int()>& enqueue,
                               std::vector<Tensor> keep);

  int device_;
  std::shared_ptr<State> state_;
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_NCCL_PROCESS_GROUP_H_
