#ifndef CORE_COMM_GLOO_PROCESS_GROUP_H_
#define CORE_COMM_GLOO_PROCESS_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/comm/serial_queue.h"
#include "core/comm/store.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace mcc {
namespace comm {

// Collectives on CPU tensors through gloo's TCP transport.
//
// Collectives run in order on one worker thread per group; point-to-point
// transfers are posted at once from the calling thread and completed by
// Work::Wait on the waiting thread (sends and receives of any tags may be
// waited for in any order); BatchP2P posts all of its transfers at once and
// completes when all have (ProcessGroup's default). 16-bit floating types
// (bf16, fp16) are reduced in fp32: the values are widened to fp32, reduced
// (all-reduce: gloo's ring; reduce- scatter: our own ring over gloo's unbound
// buffers), then rounded back to 16 bits once, so the result is the fp32
// reduction rounded to nearest even. Average is the sum divided by the group
// size (integers: truncated).
//
// The transport binds to GLOO_SOCKET_IFNAME when set, to 127.0.0.1 when
// MASTER_ADDR is a loopback address or unset, else to this host's name.
class GlooProcessGroup : public ProcessGroup {
 public:
  // Connects the ranks through `store` (keys prefixed per group).
  static absl::StatusOr<std::shared_ptr<GlooProcessGroup>> Create(
      std::shared_ptr<Store> store, int rank, int size, std::string name,
      std::vector<int> global_ranks, GroupOptions options);
  ~GlooProcessGroup() override;

  absl::string_view backend() const override { return "gloo"; }
  // The CPU, or the host-backed test device (GroupOptions::device), whose
  // tensors gloo moves through their host views as NCCL moves GPU memory.
  Device device() const override { return options().device; }

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
  GlooProcessGroup(int rank, int size, std::string name,
                   std::vector<int> global_ranks, std::shared_ptr<Store> store,
                   GroupOptions options);
  // Queues fn on the collective thread; gloo's exceptions become the work's
  // error, naming the call.
  std::shared_ptr<Work> Enqueue(const Call& call, std::function<void()> fn);
  void RingReduceScatter(const Call& call, const void* in, void* out,
                         int64_t block, DType dtype, ReduceOp op);

  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<SerialQueue> collectives_;
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_GLOO_PROCESS_GROUP_H_
