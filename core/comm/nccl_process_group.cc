#include "core/comm/nccl_process_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace comm {

struct NcclProcessGroup::State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;  // One int for Barrier.
  std::mutex mu;
  bool aborted = false;

  ~State() {
    if (comm != nullptr) {
      if (aborted) {
        // Already aborted.
      } else {
        ncclCommDestroy(comm);
      }
    }
    if (scratch != nullptr) cudaFree(scratch);
    if (stream != nullptr) cudaStreamDestroy(stream);
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

NcclProcessGroup::NcclProcessGroup(int rank, int size, std::string name,
                                   std::vector<int> global_ranks,
                                   std::shared_ptr<Store> store,
                                   GroupOptions options, int device)
    : ProcessGroup(rank, size, std::move(name), std::move(global_ranks),
                   std::move(store), std::move(options)),
      device_(device),
      state_(std::make_shared<State>()) {}

NcclProcessGroup::~NcclProcessGroup() = default;

absl::StatusOr<std::shared_ptr<NcclProcessGroup>> NcclProcessGroup::Create(
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
  ce = cudaSetDevice(device);
  if (ce != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat(where, ": cudaSetDevice: ", cudaGetErrorString(ce)));
  }
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
  std::shared_ptr<NcclProcessGroup> group(
      new NcclProcessGroup(rank, size, name, std::move(global_ranks),
                           std::move(store), std::move(options), device));
  State& st = *group->state_;
  // Non-blocking init, so a rank that never comes is a timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&st.comm, size, id, rank, &config);
  const absl::Time deadline = absl::Now() + group->options().timeout;
  while (r == ncclInProgress || r == ncclSuccess) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(st.comm, &async);
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
  if (ce != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat(where, ": ", cudaGetErrorString(ce)));
  }
  return group;
}

std::shared_ptr<Work> NcclProcessGroup::Launch(
    const Call& call, const std::function<int()>& enqueue,
    std::vector<Tensor> keep) {
  absl::Status broken = broken_status();
  if (!broken.ok()) {
    return Work::Done(absl::FailedPreconditionError(
        absl::StrCat(call.what,
                     ": the group is unusable after an earlier "
                     "failure: ",
                     broken.message())));
  }
  cudaSetDevice(device_);
  State& st = *state_;
  // Inputs written on the default stream must be ready first.
  cudaEvent_t ready, done;
  cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  cudaEventRecord(ready, cudaStreamLegacy);
  cudaStreamWaitEvent(st.stream, ready, 0);
  cudaEventDestroy(ready);
  const int r = enqueue();
  if (r != ncclSuccess && r != ncclInProgress) {
    cudaEventDestroy(done);
    return Work::Done(Fail(call, absl::StatusCode::kInternal, NcclError(r)));
  }
  cudaEventRecord(done, st.stream);
  // The default stream waits for the result, as PyTorch's current stream
  // does after Wait.
  const absl::Time deadline = absl::Now() + call.timeout;
  std::shared_ptr<State> state = state_;
  auto waiter = [this, call, done, deadline, state, keep = std::move(keep)](
                    absl::Duration timeout, bool* finished) -> absl::Status {
    const absl::Time until = std::min(deadline, absl::Now() + timeout);
    while (true) {
      cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) {
        cudaStreamWaitEvent(cudaStreamLegacy, done, 0);
        cudaEventDestroy(done);
        *finished = true;
        return absl::OkStatus();
      }
      if (q != cudaErrorNotReady) {
        *finished = true;
        return Fail(call, absl::StatusCode::kInternal,
                    absl::StrCat("CUDA error: ", cudaGetErrorString(q)));
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(state->comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        state->Abort();
        *finished = true;
        return Fail(call, absl::StatusCode::kUnavailable, NcclError(async));
      }
      if (absl::Now() >= deadline) {
        state->Abort();
        *finished = true;
        return Fail(call, absl::StatusCode::kDeadlineExceeded,
                    absl::StrCat("did not complete within its timeout of ",
                                 absl::FormatDuration(call.timeout),
                                 " (communicator aborted)"));
      }
      if (absl::Now() >= until) return absl::DeadlineExceededError("");
      absl::SleepFor(absl::Microseconds(50));
    }
  };
  return std::make_shared<Work>(call.what, call.timeout, std::move(waiter));
}

std::shared_ptr<Work> NcclProcessGroup::DoAllReduce(const Call& call, Tensor t,
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

std::shared_ptr<Work> NcclProcessGroup::DoAllGather(const Call& call, Tensor in,
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

std::shared_ptr<Work> NcclProcessGroup::DoAllGatherV(
    const Call& call, Tensor in, Tensor out,
    std::vector<int64_t> elements_per_rank) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  const size_t esize = DTypeSize(in.dtype());
                  char* base = static_cast<char*>(out.raw_data());
                  size_t offset = 0;
                  ncclGroupStart();
                  for (int q = 0; q < size(); ++q) {
                    const size_t n = elements_per_rank[q];
                    if (n > 0) {
                      ncclBroadcast(q == rank() ? in.raw_data() : base + offset,
                                    base + offset, n, NcclType(in.dtype()), q,
                                    st->comm, st->stream);
                    }
                    offset += n * esize;
                  }
                  return static_cast<int>(ncclGroupEnd());
                },
                {in, out});
}

std::shared_ptr<Work> NcclProcessGroup::DoReduceScatter(const Call& call,
                                                        Tensor in, Tensor out,
                                                        ReduceOp op) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclReduceScatter(in.raw_data(), out.raw_data(),
                                           out.numel(), NcclType(in.dtype()),
                                           NcclOp(op), st->comm, st->stream);
                },
                {in, out});
}

std::shared_ptr<Work> NcclProcessGroup::DoBroadcast(const Call& call, Tensor t,
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

std::shared_ptr<Work> NcclProcessGroup::DoAllToAll(const Call& call, Tensor in,
                                                   Tensor out) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  const size_t block = in.numel() / size();
                  const size_t bytes = block * DTypeSize(in.dtype());
                  char* src = static_cast<char*>(in.raw_data());
                  char* dst = static_cast<char*>(out.raw_data());
                  ncclGroupStart();
                  for (int q = 0; q < size(); ++q) {
                    ncclSend(src + q * bytes, block, NcclType(in.dtype()), q,
                             st->comm, st->stream);
                    ncclRecv(dst + q * bytes, block, NcclType(in.dtype()), q,
                             st->comm, st->stream);
                  }
                  return static_cast<int>(ncclGroupEnd());
                },
                {in, out});
}

std::shared_ptr<Work> NcclProcessGroup::DoBarrier(const Call& call) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclAllReduce(st->scratch, st->scratch, 1, ncclInt32,
                                       ncclSum, st->comm, st->stream);
                },
                {});
}

std::shared_ptr<Work> NcclProcessGroup::DoSend(const Call& call, Tensor t,
                                               int dst, uint32_t) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclSend(t.raw_data(), t.numel(), NcclType(t.dtype()),
                                  dst, st->comm, st->stream);
                },
                {t});
}

std::shared_ptr<Work> NcclProcessGroup::DoRecv(const Call& call, Tensor t,
                                               int src, uint32_t) {
  State* st = state_.get();
  return Launch(call,
                [&] {
                  return ncclRecv(t.raw_data(), t.numel(), NcclType(t.dtype()),
                                  src, st->comm, st->stream);
                },
                {t});
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> NcclProcessGroup::CreateSubgroup(
    int rank, int size, std::string name, std::vector<int> global_ranks,
    std::shared_ptr<Store> store, GroupOptions options) {
  MCC_ASSIGN_OR_RETURN(
      std::shared_ptr<NcclProcessGroup> group,
      Create(std::move(store), rank, size, std::move(name),
             std::move(global_ranks), std::move(options), device_));
  return std::shared_ptr<ProcessGroup>(std::move(group));
}

}  // namespace comm
}  // namespace mcc
