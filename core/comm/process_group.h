#ifndef CORE_COMM_PROCESS_GROUP_H_
#define CORE_COMM_PROCESS_GROUP_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/comm/store.h"
#include "core/tensor.h"

namespace mcc {
namespace comm {

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

// Seconds the calling thread has spent blocked in Work::Wait, over its
// life: the time it waited on peers. A rank's step time less this is its own
// busy time, which the straggler report compares across ranks (a rank that
// waits on a slow peer is not slow itself).
double ThreadSecondsBlockedInWait();

// The handle of one asynchronous operation. Wait() may be called from any
// thread, any number of times; every call returns the same final status
// once the operation has finished.
class Work {
 public:
  // `what` names the operation, group, rank and sequence number for errors.
  Work(std::string what, absl::Duration default_timeout);
  // A work completed by polling: waiter(timeout, &finished) waits up to
  // timeout and sets finished once the operation is over (successfully or
  // not), returning its status (used for point-to-point transfers and CUDA
  // streams). It may be called again while not finished.
  using Waiter = std::function<absl::Status(absl::Duration, bool*)>;
  Work(std::string what, absl::Duration default_timeout, Waiter waiter);
  static std::shared_ptr<Work> Done(absl::Status status);

  // A work that finishes when every one of `works` has (all already
  // issued, none device-ordered): its status is the first failure among
  // them, else OK.
  static std::shared_ptr<Work> All(std::string what,
                                   absl::Duration default_timeout,
                                   std::vector<std::shared_ptr<Work>> works);

  // Waits up to timeout; DeadlineExceeded (naming the operation) when the
  // operation has not finished by then. A device-ordered work (see
  // SetDeviceWait) does not block: it orders the caller's current stream
  // after the operation and returns at once.
  absl::Status Wait(absl::Duration timeout);
  // Waits until the operation finishes: it fails by itself once its own
  // timeout passes, so this never hangs.
  absl::Status Wait();
  bool IsCompleted();
  const std::string& what() const { return what_; }

  // Marks the operation finished (backends call this once).
  void MarkDone(absl::Status status);
  // Runs fn once with the final status when the operation is seen to finish
  // (at once if it already has). A waiter released by MarkDone sees fn's
  // effects: fn runs before waiters wake. For the flight recorder.
  void SetOnDone(std::function<void(const absl::Status&)> fn);

  // Makes the work device-ordered, as a CUDA work in PyTorch: Wait calls
  // device_wait (which makes the calling thread's current stream wait for
  // the operation) and returns its error, or the operation's if it has
  // already failed, without blocking the host; the backend's watchdog calls
  // MarkDone when the operation has finished. Set before the work is shared.
  void SetDeviceWait(std::function<absl::Status()> device_wait);

 private:
  // With status_ set and `lock` held: runs on_done_ (unlocked) and only then
  // marks the work done and wakes waiters, so they see its effects.
  void FinishLocked(std::unique_lock<std::mutex>& lock);

  std::function<absl::Status()> device_wait_;
  std::function<void(const absl::Status&)> on_done_;
  std::string what_;
  absl::Duration default_timeout_;
  Waiter waiter_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  // MarkDone has the final status and is running on_done_; waiters still
  // wait, and a late SetOnDone runs its callback at once.
  bool finishing_ = false;
  absl::Status status_;
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
class ProcessGroup {
 public:
  ProcessGroup(int rank, int size, std::string name,
               std::vector<int> global_ranks, std::shared_ptr<Store> store,
               GroupOptions options);
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  // The ranks of the world group that make up this group, in group order.
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  virtual absl::string_view backend() const = 0;
  // The device whose tensors this group moves (cpu for gloo).
  virtual Device device() const = 0;
  const GroupOptions& options() const { return options_; }
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

  // What a collective is, for errors and fingerprints.
  struct Call {
    std::string op;           // "AllReduce"
    std::string signature;    // "AllReduce(sum, fp32[3, 5])"
    std::string fingerprint;  // what must agree across ranks
    int64_t seq = -1;         // sequence number in this group (-1: p2p)
    int64_t p2p_index = -1;   // index among this group's p2p calls
    absl::Duration timeout;
    // "AllReduce(sum, fp32[3, 5]) #7 in group 'world' on rank 1 of 4"
    std::string what;
  };

 protected:
  // Backends implement these; arguments are already checked.
  virtual std::shared_ptr<Work> DoAllReduce(const Call& call, Tensor t,
                                            ReduceOp op) = 0;
  virtual std::shared_ptr<Work> DoAllGather(const Call& call, Tensor in,
                                            Tensor out) = 0;
  virtual std::shared_ptr<Work> DoAllGatherV(
      const Call& call, Tensor in, Tensor out,
      std::vector<int64_t> elements_per_rank) = 0;
  virtual std::shared_ptr<Work> DoReduceScatter(const Call& call, Tensor in,
                                                Tensor out, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> DoBroadcast(const Call& call, Tensor t,
                                            int root) = 0;
  virtual std::shared_ptr<Work> DoAllToAll(const Call& call, Tensor in,
                                           Tensor out) = 0;
  virtual std::shared_ptr<Work> DoBarrier(const Call& call) = 0;
  virtual std::shared_ptr<Work> DoSend(const Call& call, Tensor t, int dst,
                                       uint32_t tag) = 0;
  virtual std::shared_ptr<Work> DoRecv(const Call& call, Tensor t, int src,
                                       uint32_t tag) = 0;
  // Posts every op (checked, at least one) and returns a work that finishes
  // with all of them. The default posts each through DoSend / DoRecv, which
  // suits backends whose transfers progress independently (gloo).
  virtual std::shared_ptr<Work> DoBatchP2P(const Call& call,
                                           std::vector<P2POp> ops);
  // Creates this backend's group over `store` (already prefixed for it).
  virtual absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateSubgroup(
      int rank, int size, std::string name, std::vector<int> global_ranks,
      std::shared_ptr<Store> store, GroupOptions options) = 0;

  // Turns a backend failure into the error every caller sees: names the
  // call, and the lost ranks when the store knows of any, and marks the
  // group broken.
  absl::Status Fail(const Call& call, absl::StatusCode code,
                    absl::string_view detail);
  // The first error that broke the group (OK while healthy).
  absl::Status broken_status();
  const std::shared_ptr<Store>& store() const { return store_; }
  // Global ranks the liveness store reports lost, within this group.
  std::vector<int> LostGroupMembers(absl::Duration wait);

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

  const int rank_;
  const int size_;
  const std::string name_;
  const std::vector<int> global_ranks_;
  std::shared_ptr<Store> store_;
  GroupOptions options_;
  std::atomic<int64_t> seq_{0};
  std::atomic<int64_t> p2p_seq_{0};
  int subgroups_ = 0;
  std::mutex broken_mu_;
  absl::Status broken_;
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_PROCESS_GROUP_H_
