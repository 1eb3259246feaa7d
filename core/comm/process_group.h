#ifndef CORE_COMM_PROCESS_GROUP_H_
#define CORE_COMM_PROCESS_GROUP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/comm/store.h"
#include "core/comm/work.h"
#include "core/tensor.h"

namespace mcc {
namespace comm {

class Backend;
struct Call;

enum class ReduceOp { kSum, kAvg, kMax, kMin };
absl::string_view ReduceOpName(ReduceOp op);  // "sum", "avg", "max", "min"

struct CollectiveOptions {
  // Zero: the group's default timeout.
  absl::Duration timeout = absl::ZeroDuration();
};

// Whether collective checking is on: --debug_collectives (also spelled
// --debug-collectives by binaries that translate Megatron's names) or the
// environment variable MCC_DEBUG_COLLECTIVES=1.
bool DebugCollectivesDefault();

struct GroupOptions {
  // Default timeout of every collective (and of the group's rendezvous).
  absl::Duration timeout = absl::Minutes(5);
  // Exchange a fingerprint of every collective through the store before any
  // data moves, and fail on every rank when the ranks disagree.
  bool debug_collectives = DebugCollectivesDefault();
  // A store connection used only to ask which ranks were lost, when a
  // collective fails (may be null).
  std::shared_ptr<Store> liveness_store;
  // The device whose tensors a gloo group moves: the CPU, or a host-backed
  // device (the test device). NCCL groups take their GPU separately.
  Device device = Device::CPU();
  // NCCL: Work::Wait blocks the host until the operation has finished (as
  // TORCH_NCCL_BLOCKING_WAIT=1). By default it only makes the caller's
  // current stream wait for it; a failure or timeout is then found by the
  // group's watchdog, logged, and returned by the next call.
  bool blocking_wait = false;
};

// One transfer of a ProcessGroup::BatchP2P.
struct P2POp {
  enum Kind { kSend, kRecv };
  Kind kind = kSend;
  // The tensor sent, or the one received into (a handle on the caller's
  // storage).
  Tensor tensor;
  int peer = 0;  // Group rank.
  // gloo matches on it; NCCL does not (see BatchP2P).
  uint32_t tag = 0;

  static P2POp Send(Tensor t, int dst, uint32_t tag = 0) {
    return {kSend, std::move(t), dst, tag};
  }
  static P2POp Recv(Tensor t, int src, uint32_t tag = 0) {
    return {kRecv, std::move(t), src, tag};
  }
};

// A set of processes that run collectives together, as
// torch.distributed's ProcessGroup. Every collective is asynchronous and
// returns a Work; the *Sync wrappers wait for it. Calls are issued in
// program order and every rank of the group must make the same calls in
// the same order. Tensor arguments must stay alive until the work is done
// (the Work holds a reference to their storage).
//
// Buffer sizes, dtypes and devices are checked before anything moves. A
// collective that does not finish within its timeout fails with an error
// naming the operation, the group, the rank and the sequence number, and
// the ranks that were lost, if any. After a failure the group is unusable:
// later calls fail at once with the first error.
class ProcessGroup final {
 public:
  // The group over `backend` (backend.h), made by a backend's factory:
  // CreateGlooProcessGroup, CreateNcclProcessGroup, InitWorld.
  explicit ProcessGroup(std::unique_ptr<Backend> backend);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  const std::string& name() const;
  // The ranks of the world group that make up this group, in group order.
  const std::vector<int>& global_ranks() const;
  absl::string_view backend() const;
  // The device whose tensors this group moves (cpu for gloo).
  Device device() const;
  const GroupOptions& options() const;
  int64_t sequence_number() const { return seq_; }

  // In place on every rank: t = op(t over all ranks).
  std::shared_ptr<Work> AllReduce(Tensor* t, ReduceOp op,
                                  const CollectiveOptions& opts = {});
  // out = the ranks' `in` concatenated along dim 0 (out: size x in).
  std::shared_ptr<Work> AllGather(const Tensor& in, Tensor* out,
                                  const CollectiveOptions& opts = {});
  // Uneven all-gather: rank r contributes rows_per_rank[r] rows (dim 0).
  std::shared_ptr<Work> AllGatherV(const Tensor& in, Tensor* out,
                                   const std::vector<int64_t>& rows_per_rank,
                                   const CollectiveOptions& opts = {});
  // out = block `rank` (along dim 0) of op(in over all ranks); in: size x out.
  std::shared_ptr<Work> ReduceScatter(const Tensor& in, Tensor* out,
                                      ReduceOp op,
                                      const CollectiveOptions& opts = {});
  std::shared_ptr<Work> Broadcast(Tensor* t, int root,
                                  const CollectiveOptions& opts = {});
  // Block j (along dim 0) of `in` goes to rank j, and block i of `out` comes
  // from rank i. in and out have the same shape, dim 0 divisible by size.
  std::shared_ptr<Work> AllToAll(const Tensor& in, Tensor* out,
                                 const CollectiveOptions& opts = {});
  std::shared_ptr<Work> Barrier(const CollectiveOptions& opts = {});
  // Posts sends and receives together (torch.distributed.batch_isend_irecv):
  // NCCL runs them inside one ncclGroupStart/End, so two ranks that send to
  // each other in one batch cannot deadlock; gloo posts them all at once.
  // The work finishes when every transfer has. Portable callers must not
  // rely on tags: NCCL ignores them, and transfers from one rank to another
  // match the other's receives from it in posting order (also across
  // batches and single Send/Recv calls). A rank may appear in several ops;
  // empty batches are done at once.
  std::shared_ptr<Work> BatchP2P(std::vector<P2POp> ops,
                                 const CollectiveOptions& opts = {});
  absl::Status BatchP2PSync(std::vector<P2POp> ops,
                            const CollectiveOptions& opts = {}) {
    return BatchP2P(std::move(ops), opts)->Wait();
  }
  // Point to point; a Send matches the Recv with the same tag, in order
  // (gloo; NCCL ignores the tag: see BatchP2P).
  std::shared_ptr<Work> Send(const Tensor& t, int dst, uint32_t tag = 0,
                             const CollectiveOptions& opts = {});
  std::shared_ptr<Work> Recv(Tensor* t, int src, uint32_t tag = 0,
                             const CollectiveOptions& opts = {});

  absl::Status AllReduceSync(Tensor* t, ReduceOp op,
                             const CollectiveOptions& opts = {}) {
    return AllReduce(t, op, opts)->Wait();
  }
  absl::Status AllGatherSync(const Tensor& in, Tensor* out,
                             const CollectiveOptions& opts = {}) {
    return AllGather(in, out, opts)->Wait();
  }
  absl::Status AllGatherVSync(const Tensor& in, Tensor* out,
                              const std::vector<int64_t>& rows_per_rank,
                              const CollectiveOptions& opts = {}) {
    return AllGatherV(in, out, rows_per_rank, opts)->Wait();
  }
  absl::Status ReduceScatterSync(const Tensor& in, Tensor* out, ReduceOp op,
                                 const CollectiveOptions& opts = {}) {
    return ReduceScatter(in, out, op, opts)->Wait();
  }
  absl::Status BroadcastSync(Tensor* t, int root,
                             const CollectiveOptions& opts = {}) {
    return Broadcast(t, root, opts)->Wait();
  }
  absl::Status AllToAllSync(const Tensor& in, Tensor* out,
                            const CollectiveOptions& opts = {}) {
    return AllToAll(in, out, opts)->Wait();
  }
  absl::Status BarrierSync(const CollectiveOptions& opts = {}) {
    return Barrier(opts)->Wait();
  }
  absl::Status SendSync(const Tensor& t, int dst, uint32_t tag = 0,
                        const CollectiveOptions& opts = {}) {
    return Send(t, dst, tag, opts)->Wait();
  }
  absl::Status RecvSync(Tensor* t, int src, uint32_t tag = 0,
                        const CollectiveOptions& opts = {}) {
    return Recv(t, src, tag, opts)->Wait();
  }

  // Called collectively by every rank of this group, with the same list of
  // this group's ranks in the same order (as torch.distributed.new_group).
  // Members get the new group (its rank i is ranks[i]); the others get null.
  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewSubgroup(
      std::vector<int> ranks, const GroupOptions* options = nullptr);

 private:
  absl::StatusOr<Call> Begin(std::string op, std::string signature,
                             std::string fingerprint, bool collective,
                             const CollectiveOptions& opts);
  absl::Status CheckFingerprints(const Call& call);
  // Records the call in the flight recorder and marks it finished when the
  // work is; shows it to the installed CallObserver, if any
  // (call_observer.h: train --profile's timeline).
  std::shared_ptr<Work> Recorded(
      const Call& call, int64_t bytes, int peer,
      const std::function<std::shared_ptr<Work>()>& run);
  absl::Status CheckTensor(const Tensor& t, absl::string_view what,
                           absl::string_view role);

  std::unique_ptr<Backend> backend_;
  std::atomic<int64_t> seq_{0};
  std::atomic<int64_t> p2p_seq_{0};
  int subgroups_ = 0;
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_PROCESS_GROUP_H_
