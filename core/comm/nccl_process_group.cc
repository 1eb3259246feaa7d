#include "core/comm/nccl_process_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/comm/backend.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace comm {

// The transport behind CreateNcclProcessGroup (nccl_process_group.h says
// how it behaves).
class NcclBackend : public Backend {
 public:
  // `device` is this rank's CUDA device index (typically LOCAL_RANK).
  static absl::StatusOr<std::unique_ptr<NcclBackend>> Create(
      std::shared_ptr<Store> store, int rank, int size, std::string name,
      std::vector<int> global_ranks, GroupOptions options, int device);
  ~NcclBackend() override;

  absl::string_view type() const override { return "nccl"; }
  Device device() const override { return Device::CUDA(device_); }

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
  absl::StatusOr<std::unique_ptr<Backend>> CreateSubgroup(
      int rank, int size, std::string name, std::vector<int> global_ranks,
      std::shared_ptr<Store> store, GroupOptions options) override;

 private:
  struct State;
  NcclBackend(int rank, int size, std::string name,
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

namespace {

// A CUDA event destroyed (on its device) with the last reference: works
// hold their completion event for Wait after the watchdog has let go.
struct OwnedEvent {
  int device = -1;
  cudaEvent_t event = nullptr;
  ~OwnedEvent() {
    if (event == nullptr) return;
    cuda::DeviceGuard guard(device);
    const cudaError_t e = cudaEventDestroy(event);
    LOG_IF(ERROR, e != cudaSuccess)
        << "cudaEventDestroy: " << cudaGetErrorString(e);
  }
};

std::string CudaError(absl::string_view what, cudaError_t e) {
  (void)cudaGetLastError();  // Clears the error for later calls.
  return absl::StrCat(what, ": CUDA error ", cudaGetErrorName(e), " (",
                      cudaGetErrorString(e), ")");
}

}  // namespace

struct NcclBackend::State {
  int device = -1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;  // One int for Barrier.
  std::mutex mu;
  bool aborted = false;

  // Operations on the group's stream, oldest first, until they finish.
  struct Pending {
    Call call;
    std::shared_ptr<OwnedEvent> done;
    absl::Time deadline;
    std::shared_ptr<Work> work;
    std::vector<Tensor> keep;
  };
  std::mutex pending_mu;
  std::condition_variable pending_cv;
  std::deque<Pending> pending;
  bool stopping = false;

  ~State() {
    cuda::DeviceGuard guard(comm != nullptr || stream != nullptr ? device : -1);
    if (comm != nullptr && !aborted) {
      // The watchdog has seen every operation finish.
      ncclCommDestroy(comm);
    }
    if (scratch != nullptr) cudaFree(scratch);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // ncclCommGetAsyncError's state (an error once aborted: the communicator
  // is gone then).
  ncclResult_t AsyncError() {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) return ncclInvalidUsage;
    ncclResult_t async = ncclSuccess;
    const ncclResult_t got = ncclCommGetAsyncError(comm, &async);
    return got != ncclSuccess ? got : async;
  }

  void Abort() {
    std::lock_guard<std::mutex> lock(mu);
    if (!aborted && comm != nullptr) {
      ncclCommAbort(comm);
      aborted = true;
    }
  }
};

namespace {

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kInt8:
      return ncclInt8;
  }
  LOG(FATAL) << "NcclType: unknown dtype " << static_cast<int>(dtype);
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

std::string NcclError(int r) {
  return absl::StrCat("NCCL error ", r, ": ",
                      ncclGetErrorString(static_cast<ncclResult_t>(r)));
}

}  // namespace

NcclBackend::NcclBackend(int rank, int size, std::string name,
                         std::vector<int> global_ranks,
                         std::shared_ptr<Store> store, GroupOptions options,
                         int device)
    : Backend(rank, size, std::move(name), std::move(global_ranks),
              std::move(store), std::move(options)),
      device_(device),
      state_(std::make_shared<State>()) {}

NcclBackend::~NcclBackend() {
  {
    std::lock_guard<std::mutex> lock(state_->pending_mu);
    state_->stopping = true;
  }
  state_->pending_cv.notify_all();
  // Returns once every pending operation has finished or timed out.
  if (watchdog_.joinable()) watchdog_.join();
}

absl::StatusOr<std::unique_ptr<NcclBackend>> NcclBackend::Create(
    std::shared_ptr<Store> store, int rank, int size, std::string name,
    std::vector<int> global_ranks, GroupOptions options, int device) {
  const std::string where =
      absl::StrCat("creating NCCL group '", name, "' on rank ", rank, " of ",
                   size, " (cuda:", device, ")");
  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || device < 0 || device >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": no such CUDA device (", count, " visible",
        ce != cudaSuccess ? absl::StrCat(": ", cudaGetErrorString(ce)) : "",
        ")"));
  }
  // The communicator, stream and scratch belong to `device`; the caller's
  // current device is restored on return.
  cuda::DeviceGuard device_guard(device);
  // Rank 0 makes the unique id; the others read it from the store.
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return absl::InternalError(absl::StrCat(where, ": ", NcclError(r)));
    }
    MCC_RETURN_IF_ERROR(store->Set(
        "nccl_id",
        absl::string_view(reinterpret_cast<const char*>(&id), sizeof(id))));
  } else {
    absl::StatusOr<std::string> v = store->Get("nccl_id", options.timeout);
    if (!v.ok()) {
      return absl::Status(v.status().code(),
                          absl::StrCat(where,
                                       ": waiting for rank 0's NCCL "
                                       "unique id: ",
                                       v.status().message()));
    }
    if (v->size() != sizeof(id)) {
      return absl::DataLossError(where + ": bad NCCL unique id in the store");
    }
    std::memcpy(&id, v->data(), sizeof(id));
  }
  std::unique_ptr<NcclBackend> group(
      new NcclBackend(rank, size, name, std::move(global_ranks),
                      std::move(store), std::move(options), device));
  State& st = *group->state_;
  st.device = device;
  // Non-blocking init, so a rank that never comes is a timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&st.comm, size, id, rank, &config);
  const absl::Time deadline = absl::Now() + group->options().timeout;
  while (r == ncclInProgress || r == ncclSuccess) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(st.comm, &async);
    if (q != ncclSuccess) async = q;
    if (async == ncclSuccess) {
      r = ncclSuccess;
      break;
    }
    if (async != ncclInProgress) {
      r = async;
      break;
    }
    if (absl::Now() > deadline) {
      st.Abort();
      return absl::DeadlineExceededError(
          absl::StrCat(where, ": the other ranks did not join within ",
                       absl::FormatDuration(group->options().timeout)));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (r != ncclSuccess) {
    st.Abort();
    return absl::UnavailableError(absl::StrCat(where, ": ", NcclError(r)));
  }
  ce = cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking);
  if (ce == cudaSuccess) ce = cudaMalloc(&st.scratch, sizeof(int));
  if (ce == cudaSuccess) ce = cudaMemset(st.scratch, 0, sizeof(int));
  if (ce != cudaSuccess) {
    return absl::InternalError(CudaError(where, ce));
  }
  group->watchdog_ = std::thread([g = group.get()] { g->Watchdog(); });
  return group;
}

std::shared_ptr<Work> NcclBackend::Launch(const Call& call,
                                          const std::function<int()>& enqueue,
                                          std::vector<Tensor> keep) {
  absl::Status broken = broken_status();
  if (!broken.ok()) {
    return Work::Done(absl::FailedPreconditionError(
        absl::StrCat(call.what,
                     ": the group is unusable after an earlier "
                     "failure: ",
                     broken.message())));
  }
  State& st = *state_;
  cuda::DeviceGuard device_guard(device_);
  // The inputs are ready once the caller's current stream has reached this
  // point: the group's stream waits for it there.
  const cudaStream_t caller = cuda::CurrentStream(device_);
  cudaEvent_t ready = nullptr;
  cudaError_t ce = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  if (ce != cudaSuccess) {
    return Work::Done(Fail(call, absl::StatusCode::kInternal,
                           CudaError("creating an event", ce)));
  }
  ce = cudaEventRecord(ready, caller);
  if (ce == cudaSuccess) ce = cudaStreamWaitEvent(st.stream, ready, 0);
  const cudaError_t destroyed = cudaEventDestroy(ready);
  if (ce == cudaSuccess) ce = destroyed;
  if (ce != cudaSuccess) {
    return Work::Done(
        Fail(call, absl::StatusCode::kInternal,
             CudaError("ordering the group's stream after the current "
                       "stream",
                       ce)));
  }
  auto done = std::make_shared<OwnedEvent>();
  done->device = device_;
  ce = cudaEventCreateWithFlags(&done->event, cudaEventDisableTiming);
  if (ce != cudaSuccess) {
    done->event = nullptr;
    return Work::Done(Fail(call, absl::StatusCode::kInternal,
                           CudaError("creating an event", ce)));
  }
  int r = ncclInvalidUsage;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.aborted) r = enqueue();
  }
  // A non-blocking communicator may still be queueing the kernels: the
  // completion event must follow them.
  const absl::Time deadline = absl::Now() + call.timeout;
  while (r == ncclInProgress) {
    r = st.AsyncError();
    if (r == ncclInProgress) {
      if (absl::Now() >= deadline) {
        st.Abort();
        return Work::Done(FailPending(
            call, absl::StatusCode::kDeadlineExceeded,
            absl::StrCat("could not be queued within its timeout of ",
                         absl::FormatDuration(call.timeout),
                         " (communicator aborted)")));
      }
      absl::SleepFor(absl::Microseconds(20));
    }
  }
  if (r != ncclSuccess) {
    st.Abort();
    return Work::Done(
        FailPending(call, absl::StatusCode::kInternal, NcclError(r)));
  }
  ce = cudaEventRecord(done->event, st.stream);
  if (ce != cudaSuccess) {
    return Work::Done(Fail(call, absl::StatusCode::kInternal,
                           CudaError("recording the completion event", ce)));
  }
  auto work = std::make_shared<Work>(call.what, call.timeout);
  if (!options().blocking_wait) {
    const int device = device_;
    work->SetDeviceWait([done, device, what = call.what]() -> absl::Status {
      cuda::DeviceGuard guard(device);
      const cudaError_t e =
          cudaStreamWaitEvent(cuda::CurrentStream(device), done->event, 0);
      if (e != cudaSuccess) {
        return absl::InternalError(CudaError(
            absl::StrCat(what, ": ordering the current stream after it"), e));
      }
      return absl::OkStatus();
    });
  }
  {
    std::lock_guard<std::mutex> lock(st.pending_mu);
    st.pending.push_back({call, done, deadline, work, std::move(keep)});
  }
  st.pending_cv.notify_all();
  return work;
}

absl::Status NcclBackend::FailPending(const Call& call, absl::StatusCode code,
                                      const std::string& detail) {
  const absl::Status status = Fail(call, code, detail);
  LOG(ERROR) << status.message();
  std::deque<State::Pending> failed;
  {
    std::lock_guard<std::mutex> lock(state_->pending_mu);
    failed.swap(state_->pending);
  }
  for (State::Pending& p : failed) {
    p.work->MarkDone(
        p.call.what == call.what
            ? status
            : absl::FailedPreconditionError(absl::StrCat(
                  p.call.what, ": the group failed while it was pending: ",
                  status.message())));
  }
  return status;
}

void NcclBackend::Watchdog() {
  State& st = *state_;
  // Polling: often when someone blocks on a Wait, sparingly otherwise (a
  // finished operation then only releases its tensors a little later).
  const absl::Duration poll = options().blocking_wait ? absl::Microseconds(50)
                                                      : absl::Microseconds(500);
  while (true) {
    State::Pending front;
    absl::Time earliest = absl::InfiniteFuture();
    const Call* expired = nullptr;
    Call expired_call;
    {
      std::unique_lock<std::mutex> lock(st.pending_mu);
      st.pending_cv.wait(lock,
                         [&] { return st.stopping || !st.pending.empty(); });
      if (st.pending.empty()) return;  // Stopping, nothing left.
      front = st.pending.front();
      const absl::Time now = absl::Now();
      for (const State::Pending& p : st.pending) {
        if (p.deadline < earliest) earliest = p.deadline;
        if (expired == nullptr && now >= p.deadline) {
          expired_call = p.call;
          expired = &expired_call;
        }
      }
    }
    // The stream runs its operations in order: the oldest finishes first.
    const cudaError_t q = cudaEventQuery(front.done->event);
    if (q == cudaSuccess) {
      {
        std::lock_guard<std::mutex> lock(st.pending_mu);
        if (!st.pending.empty() && st.pending.front().work == front.work) {
          st.pending.pop_front();
        }
      }
      front.work->MarkDone(absl::OkStatus());
      continue;
    }
    if (q != cudaErrorNotReady) {
      st.Abort();
      FailPending(front.call, absl::StatusCode::kInternal,
                  CudaError("waiting for completion", q))
          .IgnoreError();
      continue;
    }
    const ncclResult_t async = st.AsyncError();
    if (async != ncclSuccess && async != ncclInProgress) {
      st.Abort();
      FailPending(front.call, absl::StatusCode::kUnavailable, NcclError(async))
          .IgnoreError();
      continue;
    }
    if (expired != nullptr) {
      st.Abort();
      FailPending(*expired, absl::StatusCode::kDeadlineExceeded,
                  absl::StrCat("did not complete within its timeout of ",
                               absl::FormatDuration(expired->timeout),
                               " (communicator aborted)"))
          .IgnoreError();
      continue;
    }
    absl::SleepFor(
        std::min(poll, std::max(absl::ZeroDuration(), earliest - absl::Now())));
  }
}

std::shared_ptr<Work> NcclBackend::DoAllReduce(const Call& call, Tensor t,
                                               ReduceOp op) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclAllReduce(t.raw_data(), t.raw_data(), t.numel(),
                                       NcclType(t.dtype()), NcclOp(op),
                                       st->comm, st->stream);
                },
                {t});
}

std::shared_ptr<Work> NcclBackend::DoAllGather(const Call& call, Tensor in,
                                               Tensor out) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclAllGather(in.raw_data(), out.raw_data(),
                                       in.numel(), NcclType(in.dtype()),
                                       st->comm, st->stream);
                },
                {in, out});
}

std::shared_ptr<Work> NcclBackend::DoAllGatherV(
    const Call& call, Tensor in, Tensor out,
    std::vector<int64_t> elements_per_rank) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  const size_t esize = DTypeSize(in.dtype());
                  char* base = static_cast<char*>(out.raw_data());
                  size_t offset = 0;
                  ncclResult_t r = ncclGroupStart();
                  if (r != ncclSuccess) return static_cast<int>(r);
                  for (int q = 0; q < size(); ++q) {
                    const size_t n = elements_per_rank[q];
                    if (n > 0 && r == ncclSuccess) {
                      r = ncclBroadcast(
                          q == rank() ? in.raw_data() : base + offset,
                          base + offset, n, NcclType(in.dtype()), q, st->comm,
                          st->stream);
                    }
                    offset += n * esize;
                  }
                  const ncclResult_t end = ncclGroupEnd();
                  return static_cast<int>(r != ncclSuccess ? r : end);
                },
                {in, out});
}

std::shared_ptr<Work> NcclBackend::DoReduceScatter(const Call& call, Tensor in,
                                                   Tensor out, ReduceOp op) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclReduceScatter(in.raw_data(), out.raw_data(),
                                           out.numel(), NcclType(in.dtype()),
                                           NcclOp(op), st->comm, st->stream);
                },
                {in, out});
}

std::shared_ptr<Work> NcclBackend::DoBroadcast(const Call& call, Tensor t,
                                               int root) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclBroadcast(t.raw_data(), t.raw_data(), t.numel(),
                                       NcclType(t.dtype()), root, st->comm,
                                       st->stream);
                },
                {t});
}

std::shared_ptr<Work> NcclBackend::DoAllToAll(const Call& call, Tensor in,
                                              Tensor out) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  const size_t block = in.numel() / size();
                  const size_t bytes = block * DTypeSize(in.dtype());
                  char* src = static_cast<char*>(in.raw_data());
                  char* dst = static_cast<char*>(out.raw_data());
                  ncclResult_t r = ncclGroupStart();
                  if (r != ncclSuccess) return static_cast<int>(r);
                  for (int q = 0; q < size() && r == ncclSuccess; ++q) {
                    r = ncclSend(src + q * bytes, block, NcclType(in.dtype()),
                                 q, st->comm, st->stream);
                    if (r == ncclSuccess) {
                      r = ncclRecv(dst + q * bytes, block, NcclType(in.dtype()),
                                   q, st->comm, st->stream);
                    }
                  }
                  const ncclResult_t end = ncclGroupEnd();
                  return static_cast<int>(r != ncclSuccess ? r : end);
                },
                {in, out});
}

std::shared_ptr<Work> NcclBackend::DoBarrier(const Call& call) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclAllReduce(st->scratch, st->scratch, 1, ncclInt32,
                                       ncclSum, st->comm, st->stream);
                },
                {});
}

std::shared_ptr<Work> NcclBackend::DoSend(const Call& call, Tensor t, int dst,
                                          uint32_t) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclSend(t.raw_data(), t.numel(), NcclType(t.dtype()),
                                  dst, st->comm, st->stream);
                },
                {t});
}

std::shared_ptr<Work> NcclBackend::DoRecv(const Call& call, Tensor t, int src,
                                          uint32_t) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclRecv(t.raw_data(), t.numel(), NcclType(t.dtype()),
                                  src, st->comm, st->stream);
                },
                {t});
}

std::shared_ptr<Work> NcclBackend::DoBatchP2P(const Call& call,
                                              std::vector<P2POp> ops) {
  State* st = state_.get();
  std::vector<Tensor> keep;
  for (const P2POp& op : ops) keep.push_back(op.tensor);
  return Launch(
      call,
      [&] {
        // One group: the transfers progress together, so two ranks that
        // send to each other here cannot deadlock.
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) return static_cast<int>(r);
        for (size_t i = 0; i < ops.size() && r == ncclSuccess; ++i) {
          const Tensor& t = ops[i].tensor;
          r = ops[i].kind == P2POp::kSend
                  ? ncclSend(t.raw_data(), t.numel(), NcclType(t.dtype()),
                             ops[i].peer, st->comm, st->stream)
                  : ncclRecv(t.raw_data(), t.numel(), NcclType(t.dtype()),
                             ops[i].peer, st->comm, st->stream);
        }
        const ncclResult_t end = ncclGroupEnd();
        return static_cast<int>(r != ncclSuccess ? r : end);
      },
      std::move(keep));
}

absl::StatusOr<std::unique_ptr<Backend>> NcclBackend::CreateSubgroup(
    int rank, int size, std::string name, std::vector<int> global_ranks,
    std::shared_ptr<Store> store, GroupOptions options) {
  MCC_ASSIGN_OR_RETURN(
      std::unique_ptr<NcclBackend> backend,
      Create(std::move(store), rank, size, std::move(name),
             std::move(global_ranks), std::move(options), device_));
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateNcclProcessGroup(
    std::shared_ptr<Store> store, int rank, int size, std::string name,
    std::vector<int> global_ranks, GroupOptions options, int device) {
  MCC_ASSIGN_OR_RETURN(
      std::unique_ptr<NcclBackend> backend,
      NcclBackend::Create(std::move(store), rank, size, std::move(name),
                          std::move(global_ranks), std::move(options), device));
  return std::make_shared<ProcessGroup>(std::move(backend));
}

}  // namespace comm
}  // namespace mcc
