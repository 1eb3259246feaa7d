#ifndef CORE_COMM_PROCESS_GROUP_H_
#define CORE_COMM_PROCESS_GROUP_H_

// A process group is a set of ranks (one process each, or one GPU each) that
// move tensors together, as torch.distributed's ProcessGroup. Each rank holds
// its own ProcessGroup object; rank() is its place in the group, size() the
// number of ranks, global_ranks() their places in the job's world. The world
// group comes from InitWorld (init.h); NewSubgroup splits it further.
//
// Ordering. Every rank of a group must issue the same collectives, with
// matching arguments, in the same order: the n-th collective of one rank
// meets the n-th of every other (sequence_number() counts them). A rank that
// skips one or calls another deadlocks its peers until the timeout;
// GroupOptions::debug_collectives (or MCC_DEBUG_COLLECTIVES=1) compares the
// calls through the store first and fails every rank at once instead.
// Point-to-point transfers take no sequence number: a Recv matches the
// peer's Send to it, as Send and BatchP2P describe.
//
// Asynchrony. Every operation returns a Work (work.h) without waiting for the
// peers (under debug_collectives a collective first waits for the peers'
// fingerprints); Work::Wait returns the operation's status, and the *Sync
// forms wait at once. The group keeps a reference to each tensor's storage
// until the operation has finished, so the caller may drop its handles, but
// must not read an output or write an input before Wait has returned. On the
// CPU (gloo), Wait blocks the calling thread until the data has arrived. On a
// GPU (NCCL), an operation runs on the group's own stream after the work
// already queued on the calling thread's current stream, and Wait only makes
// the caller's current stream wait for it (GroupOptions::blocking_wait: it
// blocks the host instead), so kernels queued after Wait see the result.
//
// Errors. Arguments are checked before anything moves: a wrong dtype, shape,
// device or rank gives a Work already finished with InvalidArgument naming
// the call, and the group stays usable. Once started, an operation that has
// not finished within its timeout (CollectiveOptions::timeout, else
// GroupOptions::timeout) fails with DeadlineExceeded, and a transport failure
// with another error (Unavailable from gloo, Internal or Unavailable from
// CUDA and NCCL). The error names the operation, the group, this rank and the
// sequence number; when the liveness store knows that a peer's process died
// it is Unavailable and names the lost ranks. Such a failure also dumps this
// rank's flight recorder (for tools/analyze_hang) and breaks the group for
// good: every later call fails at once with FailedPrecondition quoting the
// first error, as do the collectives still queued behind the failed one.
// Wait() never hangs: it returns once the operation finishes or its timeout
// passes.
//
// Example: sum a gradient over every rank of the job, overlapping the
// transfer with other work.
//
//   MCC_ASSIGN_OR_RETURN(comm::World world, comm::InitWorldFromEnvironment());
//   comm::ProcessGroup& group = *world.group;
//   Tensor grad = Tensor::Full({1024}, group.rank(), DType::kFloat32);
//   std::shared_ptr<comm::Work> work =
//       group.AllReduce(&grad, comm::ReduceOp::kSum);
//   ...  // work that does not touch grad
//   MCC_RETURN_IF_ERROR(work->Wait());  // grad holds the sum over ranks
//
//   // The same in one blocking call:
//   MCC_RETURN_IF_ERROR(group.AllReduceSync(&grad, comm::ReduceOp::kSum));
//
// Backends: gloo moves CPU tensors (gloo_process_group.h), NCCL moves CUDA
// tensors (nccl_process_group.h); a new transport implements Backend
// (backend.h).

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

// How a reduction combines the ranks' values. kAvg is the sum divided by the
// group size.
enum class ReduceOp { kSum, kAvg, kMax, kMin };
absl::string_view ReduceOpName(ReduceOp op);  // "sum", "avg", "max", "min"

// Options of one call.
struct CollectiveOptions {
  // Zero: the group's default timeout.
  absl::Duration timeout = absl::ZeroDuration();
};

// Whether collective checking is on by default: after
// SetDebugCollectivesDefault(true) (a binary's --debug-collectives flag sets
// it from main) or with the environment variable MCC_DEBUG_COLLECTIVES=1.
bool DebugCollectivesDefault();
// true turns checking on for the groups created afterwards with default
// options; false leaves it to MCC_DEBUG_COLLECTIVES.
void SetDebugCollectivesDefault(bool on);

// Options of a group, fixed when it is made.
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

// This rank's handle on a process group; the contract is at the top of this
// file. Tensors go in and out as handles on the caller's storage: in-place
// operations take a Tensor*, outputs are written into `out`, which the caller
// allocates with the shape given. Tensors must be on device().
class ProcessGroup final {
 public:
  // The group over `backend`. Users get groups from InitWorld (init.h),
  // CreateGlooProcessGroup, CreateNcclProcessGroup or NewSubgroup.
  explicit ProcessGroup(std::unique_ptr<Backend> backend);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // ---- The group.

  // This rank's place in the group, 0 .. size() - 1.
  int rank() const;
  int size() const;
  // "world", or a subgroup's "world/sub0[0,2]"; errors quote it.
  const std::string& name() const;
  // The ranks of the world group that make up this group, in group order.
  const std::vector<int>& global_ranks() const;
  // "gloo", "nccl".
  absl::string_view backend() const;
  // The device whose tensors this group moves (cpu for gloo).
  Device device() const;
  const GroupOptions& options() const;
  // Collectives issued so far: the sequence number of the next one.
  int64_t sequence_number() const { return seq_; }

  // ---- Collectives. Every rank of the group calls them in the same order.

  // In place on every rank: t = op(t over all ranks).
  std::shared_ptr<Work> AllReduce(Tensor* t, ReduceOp op,
                                  const CollectiveOptions& opts = {});
  // out = the ranks' `in` concatenated along dim 0 (out: size x in).
  std::shared_ptr<Work> AllGather(const Tensor& in, Tensor* out,
                                  const CollectiveOptions& opts = {});
  // Uneven all-gather: rank r contributes rows_per_rank[r] rows (dim 0) and
  // out holds their sum of rows, in rank order. Every rank passes the same
  // rows_per_rank.
  std::shared_ptr<Work> AllGatherV(const Tensor& in, Tensor* out,
                                   const std::vector<int64_t>& rows_per_rank,
                                   const CollectiveOptions& opts = {});
  // out = block `rank` (along dim 0) of op(in over all ranks); in: size x out.
  std::shared_ptr<Work> ReduceScatter(const Tensor& in, Tensor* out,
                                      ReduceOp op,
                                      const CollectiveOptions& opts = {});
  // In place: every rank's t becomes rank `root`'s t.
  std::shared_ptr<Work> Broadcast(Tensor* t, int root,
                                  const CollectiveOptions& opts = {});
  // Block j (along dim 0) of `in` goes to rank j, and block i of `out` comes
  // from rank i. in and out have the same shape, dim 0 divisible by size.
  std::shared_ptr<Work> AllToAll(const Tensor& in, Tensor* out,
                                 const CollectiveOptions& opts = {});
  // Finishes once every rank has reached it.
  std::shared_ptr<Work> Barrier(const CollectiveOptions& opts = {});

  // ---- Point to point. `dst` and `src` are other ranks of this group.

  // A Send matches the peer's Recv with the same tag, in order (gloo; NCCL
  // ignores the tag: see BatchP2P). The received tensor must have the sent
  // one's size.
  std::shared_ptr<Work> Send(const Tensor& t, int dst, uint32_t tag = 0,
                             const CollectiveOptions& opts = {});
  std::shared_ptr<Work> Recv(Tensor* t, int src, uint32_t tag = 0,
                             const CollectiveOptions& opts = {});
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

  // ---- Blocking forms: the operation above, then Work::Wait.

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
  absl::Status BatchP2PSync(std::vector<P2POp> ops,
                            const CollectiveOptions& opts = {}) {
    return BatchP2P(std::move(ops), opts)->Wait();
  }

  // ---- Subgroups.

  // Called collectively by every rank of this group, with the same list of
  // this group's ranks in the same order (as torch.distributed.new_group);
  // blocks until the members have agreed. Members get the new group (its
  // rank i is ranks[i]), with `options` or else this group's; the others get
  // null.
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
