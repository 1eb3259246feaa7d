#ifndef CORE_COMM_NCCL_PROCESS_GROUP_H_
#define CORE_COMM_NCCL_PROCESS_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
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
  std::shared_ptr<Work> DoBatchP2P(const Call& call,
                                   std::vector<P2POp> ops) override;
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
  // The watchdog: completes pending works in order, fails them on a CUDA
  // or NCCL error or a timeout. Runs until the group is destroyed and
  // nothing is pending.
  void Watchdog();
  // Fails `call` (breaking the group), and every pending work after it.
  absl::Status FailPending(const Call& call, absl::StatusCode code,
                           const std::string& detail);

  int device_;
  std::shared_ptr<State> state_;
  std::thread watchdog_;
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_NCCL_PROCESS_GROUP_H_
