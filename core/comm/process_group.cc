#include "core/comm/process_group.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/comm/call_observer.h"
#include "core/comm/flight_recorder.h"
#include "core/status_macros.h"
#include "glog/logging.h"

ABSL_FLAG(bool, debug_collectives, false,
          "Check before every collective that all ranks of the group make "
          "the same call (operation, dtype, element count, root, rank list); "
          "also set by MCC_DEBUG_COLLECTIVES=1.");

namespace mcc {
namespace comm {
namespace {

std::string TensorSig(const Tensor& t) {
  return absl::StrCat(DTypeName(t.dtype()), t.ShapeString());
}

// "[5, 3]" with the first dimension replaced.
Shape WithDim0(const Shape& shape, int64_t d0) {
  Shape out = shape;
  if (out.empty()) out.push_back(1);
  out[0] = d0;
  return out;
}

Shape RowShape(const Tensor& t) {
  return t.dim() == 0 ? Shape{} : Shape(t.shape().begin() + 1, t.shape().end());
}

int64_t Rows(const Tensor& t) { return t.dim() == 0 ? 1 : t.size(0); }

}  // namespace

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

bool DebugCollectivesDefault() {
  if (absl::GetFlag(FLAGS_debug_collectives)) return true;
  const char* v = std::getenv("MCC_DEBUG_COLLECTIVES");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

// ---------------------------------------------------------------- Work

Work::Work(std::string what, absl::Duration default_timeout)
    : what_(std::move(what)), default_timeout_(default_timeout) {}

Work::Work(std::string what, absl::Duration default_timeout, Waiter waiter)
    : what_(std::move(what)),
      default_timeout_(default_timeout),
      waiter_(std::move(waiter)) {}

std::shared_ptr<Work> Work::Done(absl::Status status) {
  auto work = std::make_shared<Work>("", absl::ZeroDuration());
  work->MarkDone(std::move(status));
  return work;
}

void Work::MarkDone(absl::Status status) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_ || finishing_) return;
  status_ = std::move(status);
  FinishLocked(lock);
}

void Work::FinishLocked(std::unique_lock<std::mutex>& lock) {
  // on_done runs before waiters wake, so a caller that waited on this work
  // sees its effects (the flight recorder's entry is "completed"); a
  // SetOnDone meanwhile runs its callback at once.
  finishing_ = true;
  std::function<void(const absl::Status&)> on_done;
  on_done.swap(on_done_);
  if (on_done) {
    const absl::Status final_status = status_;
    lock.unlock();
    on_done(final_status);
    lock.lock();
  }
  done_ = true;
  cv_.notify_all();
}

void Work::SetOnDone(std::function<void(const absl::Status&)> fn) {
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_ && !finishing_) {
      on_done_ = std::move(fn);
      return;
    }
    status = status_;
  }
  fn(status);
}

std::shared_ptr<Work> Work::All(std::string what,
                                absl::Duration default_timeout,
                                std::vector<std::shared_ptr<Work>> works) {
  // Each work fails by itself at its own deadline; this one waits for them
  // in turn (they are all under way) within the caller's timeout.
  auto waiter = [works = std::move(works)](absl::Duration timeout,
                                           bool* finished) -> absl::Status {
    const absl::Time until = timeout == absl::InfiniteDuration()
                                 ? absl::InfiniteFuture()
                                 : absl::Now() + timeout;
    for (const std::shared_ptr<Work>& w : works) {
      absl::Status s =
          w->Wait(std::max(absl::ZeroDuration(), until - absl::Now()));
      if (!w->IsCompleted()) return absl::DeadlineExceededError("not finished");
      if (!s.ok()) {
        *finished = true;
        return s;
      }
    }
    *finished = true;
    return absl::OkStatus();
  };
  return std::make_shared<Work>(std::move(what), default_timeout,
                                std::move(waiter));
}

void Work::SetDeviceWait(std::function<absl::Status()> device_wait) {
  device_wait_ = std::move(device_wait);
}

bool Work::IsCompleted() {
  if (device_wait_) {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  Wait(absl::ZeroDuration()).IgnoreError();
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

absl::Status Work::Wait() {
  return Wait(waiter_ ? default_timeout_ : absl::InfiniteDuration());
}

namespace {
thread_local double seconds_blocked_in_wait = 0;
}  // namespace

double ThreadSecondsBlockedInWait() { return seconds_blocked_in_wait; }

absl::Status Work::Wait(absl::Duration timeout) {
  if (device_wait_) {
    absl::Status ordered = device_wait_();
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ && !status_.ok()) return status_;
    return ordered;
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (done_) return status_;
  // Counted however the wait ends.
  struct CountBlocked {
    std::chrono::steady_clock::time_point from;
    ~CountBlocked() {
      seconds_blocked_in_wait +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - from)
              .count();
    }
  } count_blocked{std::chrono::steady_clock::now()};
  if (waiter_) {
    bool finished = false;
    absl::Status s = waiter_(timeout, &finished);
    if (finished) {
      // Another thread waiting meanwhile waits on the condition variable
      // (waiter_ is gone) until the callback has run.
      status_ = std::move(s);
      waiter_ = nullptr;
      FinishLocked(lock);
    }
  } else if (!done_) {
    if (timeout == absl::InfiniteDuration()) {
      cv_.wait(lock, [this] { return done_; });
    } else {
      cv_.wait_until(lock, absl::ToChronoTime(absl::Now() + timeout),
                     [this] { return done_; });
    }
  }
  if (!done_) {
    return absl::DeadlineExceededError(absl::StrCat(
        what_, ": Wait timed out after ", absl::FormatDuration(timeout),
        " (the operation has not finished)"));
  }
  return status_;
}

// -------------------------------------------------------- ProcessGroup

ProcessGroup::ProcessGroup(int rank, int size, std::string name,
                           std::vector<int> global_ranks,
                           std::shared_ptr<Store> store, GroupOptions options)
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      global_ranks_(std::move(global_ranks)),
      store_(std::move(store)),
      options_(std::move(options)) {}

ProcessGroup::~ProcessGroup() = default;

absl::Status ProcessGroup::broken_status() {
  std::lock_guard<std::mutex> lock(broken_mu_);
  return broken_;
}

std::vector<int> ProcessGroup::LostGroupMembers(absl::Duration wait) {
  std::vector<int> lost;
  if (options_.liveness_store == nullptr) return lost;
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    absl::StatusOr<std::vector<int>> ranks =
        options_.liveness_store->LostRanks();
    if (!ranks.ok()) {
      // The store lives in global rank 0's process.
      lost.push_back(0);
      return lost;
    }
    for (int g : *ranks) {
      if (std::find(global_ranks_.begin(), global_ranks_.end(), g) !=
          global_ranks_.end()) {
        lost.push_back(g);
      }
    }
    if (!lost.empty() || absl::Now() >= deadline) return lost;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status ProcessGroup::Fail(const Call& call, absl::StatusCode code,
                                absl::string_view detail) {
  std::vector<int> lost = LostGroupMembers(
      code == absl::StatusCode::kDeadlineExceeded ? absl::Milliseconds(300)
                                                  : absl::Seconds(2));
  std::string message = absl::StrCat(call.what, " failed: ", detail);
  if (!lost.empty()) {
    std::vector<std::string> names;
    for (int g : lost) {
      const int r = static_cast<int>(
          std::find(global_ranks_.begin(), global_ranks_.end(), g) -
          global_ranks_.begin());
      names.push_back(g == r ? absl::StrCat(r)
                             : absl::StrCat(r, " (global rank ", g, ")"));
    }
    absl::StrAppend(&message, "; lost rank ", absl::StrJoin(names, ", "),
                    ": its process died or exited (connection to the "
                    "rendezvous store dropped)");
    code = absl::StatusCode::kUnavailable;
  }
  absl::Status status(code, message);
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    first = broken_.ok();
    if (first) broken_ = status;
  }
  // What this rank was doing, for tools/analyze_hang.
  if (first) FlightRecorder::Global().Dump(message).IgnoreError();
  return status;
}

absl::Status ProcessGroup::CheckTensor(const Tensor& t, absl::string_view what,
                                       absl::string_view role) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the ", role, " tensor is undefined"));
  }
  if (t.device() != device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the ", role, " tensor is ", t.Describe(), " but the ",
        backend(), " backend of group '", name_, "' moves tensors on ",
        device().ToString(), " only",
        device().is_cpu() ? " (use an NCCL group for CUDA tensors)"
                          : " (use a gloo group for CPU tensors)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProcessGroup::Call> ProcessGroup::Begin(
    std::string op, std::string signature, std::string fingerprint,
    bool collective, const CollectiveOptions& opts) {
  Call call;
  call.op = std::move(op);
  call.signature = std::move(signature);
  call.fingerprint = std::move(fingerprint);
  call.timeout =
      opts.timeout > absl::ZeroDuration() ? opts.timeout : options_.timeout;
  if (collective) {
    call.seq = seq_++;
    call.what =
        absl::StrCat(call.signature, " (sequence number ", call.seq,
                     ") in group '", name_, "' on rank ", rank_, " of ", size_);
  } else {
    call.p2p_index = p2p_seq_++;
    call.what =
        absl::StrCat(call.signature, " (p2p #", call.p2p_index, ") in group '",
                     name_, "' on rank ", rank_, " of ", size_);
  }
  absl::Status broken = broken_status();
  if (!broken.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(call.what,
                     ": the group is unusable after an earlier "
                     "failure: ",
                     broken.message()));
  }
  if (collective && options_.debug_collectives && size_ > 1) {
    MCC_RETURN_IF_ERROR(CheckFingerprints(call));
  }
  return call;
}

std::shared_ptr<Work> ProcessGroup::Recorded(
    const Call& call, int64_t bytes, int peer,
    const std::function<std::shared_ptr<Work>()>& run) {
  FlightRecord record;
  record.group = name_;
  record.group_ranks = global_ranks_;
  record.global_rank = global_ranks_[rank_];
  record.op = call.op;
  record.signature = call.signature;
  record.seq = call.seq;
  record.p2p_index = call.p2p_index;
  record.peer = peer;
  record.bytes = bytes;
  FlightRecorder& recorder = FlightRecorder::Global();
  const int64_t id = recorder.Start(std::move(record));
  // Profiling off: one atomic load, nothing allocated.
  CallObserver* observer = CurrentCallObserver();
  CallObserver::Done observed;
  if (observer != nullptr) {
    observed = observer->OnIssue({name_, call.op, call.signature, call.seq,
                                  call.p2p_index, peer, bytes});
  }
  std::shared_ptr<Work> work = run();
  if (observed) {
    work->SetOnDone(
        [id, observed = std::move(observed)](const absl::Status& status) {
          FlightRecorder::Global().Finish(id, status);
          observed(status);
        });
  } else {
    work->SetOnDone([id](const absl::Status& status) {
      FlightRecorder::Global().Finish(id, status);
    });
  }
  return work;
}

absl::Status ProcessGroup::CheckFingerprints(const Call& call) {
  const std::string prefix = absl::StrCat("fp/", call.seq, "/");
  MCC_RETURN_IF_ERROR(store_->Set(absl::StrCat(prefix, rank_),
                                  call.fingerprint + "\n" + call.signature));
  std::vector<std::string> mismatches;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    absl::StatusOr<std::string> theirs =
        store_->Get(absl::StrCat(prefix, q), call.timeout);
    if (!theirs.ok()) {
      return Fail(call, theirs.status().code(),
                  absl::StrCat("collective check (debug collectives): rank ", q,
                               " did not reach this collective: ",
                               theirs.status().message()));
    }
    const size_t nl = theirs->find('\n');
    const std::string their_fp = theirs->substr(0, nl);
    const std::string their_sig =
        nl == std::string::npos ? "" : theirs->substr(nl + 1);
    if (their_fp != call.fingerprint) {
      mismatches.push_back(absl::StrCat("rank ", q, " called ", their_sig));
    }
  }
  if (call.seq > 0) {
    store_->Delete(absl::StrCat("fp/", call.seq - 1, "/", rank_)).IgnoreError();
  }
  if (!mismatches.empty()) {
    absl::Status status = absl::InvalidArgumentError(
        absl::StrCat("collective mismatch in group '", name_,
                     "' at sequence number ", call.seq,
                     " (detected by debug collectives before any data moved): "
                     "this rank ",
                     rank_, " called ", call.signature, " but ",
                     absl::StrJoin(mismatches, "; ")));
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_.ok()) broken_ = status;
    return status;
  }
  return absl::OkStatus();
}

#define MCC_BEGIN_OR_RETURN(call, ...)                        \
  absl::StatusOr<Call> call##_or = Begin(__VA_ARGS__);        \
  if (!call##_or.ok()) return Work::Done(call##_or.status()); \
  const Call& call = *call##_or

#define MCC_CHECK_OR_RETURN(expr)        \
  do {                                   \
    absl::Status _s = (expr);            \
    if (!_s.ok()) return Work::Done(_s); \
  } while (0)

std::shared_ptr<Work> ProcessGroup::AllReduce(Tensor* t, ReduceOp op,
                                              const CollectiveOptions& opts) {
  if (t == nullptr) {
    return Work::Done(absl::InvalidArgumentError("AllReduce: null tensor"));
  }
  const std::string what =
      absl::StrCat("AllReduce on rank ", rank_, " of group '", name_, "'");
  MCC_CHECK_OR_RETURN(CheckTensor(*t, what, "in/out"));
  MCC_BEGIN_OR_RETURN(
      call, "AllReduce",
      absl::StrCat("AllReduce(", ReduceOpName(op), ", ", TensorSig(*t), ")"),
      absl::StrCat("AllReduce|", ReduceOpName(op), "|", DTypeName(t->dtype()),
                   "|", t->numel()),
      true, opts);
  return Recorded(call, t->nbytes(), -1,
                  [&] { return DoAllReduce(call, *t, op); });
}

std::shared_ptr<Work> ProcessGroup::AllGather(const Tensor& in, Tensor* out,
                                              const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("AllGather on rank ", rank_, " of group '", name_, "'");
  if (out == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null output"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(in, what, "input"));
  MCC_CHECK_OR_RETURN(CheckTensor(*out, what, "output"));
  const Shape expected = WithDim0(in.shape(), Rows(in) * size_);
  if (out->dtype() != in.dtype() || out->shape() != expected) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": output is ", TensorSig(*out), " but must be ",
                     DTypeName(in.dtype()), ShapeToString(expected), " (",
                     size_, " x input ", TensorSig(in), " along dim 0)")));
  }
  MCC_BEGIN_OR_RETURN(
      call, "AllGather",
      absl::StrCat("AllGather(", TensorSig(in), " -> ", TensorSig(*out), ")"),
      absl::StrCat("AllGather|", DTypeName(in.dtype()), "|", in.numel()), true,
      opts);
  return Recorded(call, out->nbytes(), -1,
                  [&] { return DoAllGather(call, in, *out); });
}

std::shared_ptr<Work> ProcessGroup::AllGatherV(
    const Tensor& in, Tensor* out, const std::vector<int64_t>& rows_per_rank,
    const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("AllGatherV on rank ", rank_, " of group '", name_, "'");
  if (out == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null output"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(in, what, "input"));
  MCC_CHECK_OR_RETURN(CheckTensor(*out, what, "output"));
  if (static_cast<int>(rows_per_rank.size()) != size_) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": rows_per_rank has ", rows_per_rank.size(),
                     " entries for a group of ", size_)));
  }
  int64_t total = 0;
  for (int64_t r : rows_per_rank) {
    if (r < 0) {
      return Work::Done(absl::InvalidArgumentError(
          absl::StrCat(what, ": negative entry in rows_per_rank")));
    }
    total += r;
  }
  if (in.dim() == 0 || in.size(0) != rows_per_rank[rank_]) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": input is ", TensorSig(in), " but rows_per_rank[",
                     rank_, "] = ", rows_per_rank[rank_])));
  }
  const Shape expected = WithDim0(in.shape(), total);
  if (out->dtype() != in.dtype() || out->shape() != expected) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": output is ", TensorSig(*out), " but must be ",
                     DTypeName(in.dtype()), ShapeToString(expected),
                     " (the sum of rows_per_rank along dim 0)")));
  }
  const int64_t row = NumElements(RowShape(in));
  std::vector<int64_t> elements;
  for (int64_t r : rows_per_rank) elements.push_back(r * row);
  MCC_BEGIN_OR_RETURN(
      call, "AllGatherV",
      absl::StrCat("AllGatherV(", TensorSig(in), " -> ", TensorSig(*out),
                   ", rows [", absl::StrJoin(rows_per_rank, ", "), "])"),
      absl::StrCat("AllGatherV|", DTypeName(in.dtype()), "|",
                   absl::StrJoin(elements, ",")),
      true, opts);
  return Recorded(call, out->nbytes(), -1, [&] {
    return DoAllGatherV(call, in, *out, std::move(elements));
  });
}

std::shared_ptr<Work> ProcessGroup::ReduceScatter(
    const Tensor& in, Tensor* out, ReduceOp op, const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("ReduceScatter on rank ", rank_, " of group '", name_, "'");
  if (out == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null output"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(in, what, "input"));
  MCC_CHECK_OR_RETURN(CheckTensor(*out, what, "output"));
  const Shape expected = WithDim0(out->shape(), Rows(*out) * size_);
  if (out->dtype() != in.dtype() || in.shape() != expected) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": input is ", TensorSig(in), " but must be ",
                     DTypeName(out->dtype()), ShapeToString(expected), " (",
                     size_, " x output ", TensorSig(*out), " along dim 0)")));
  }
  MCC_BEGIN_OR_RETURN(call, "ReduceScatter",
                      absl::StrCat("ReduceScatter(", ReduceOpName(op), ", ",
                                   TensorSig(in), " -> ", TensorSig(*out), ")"),
                      absl::StrCat("ReduceScatter|", ReduceOpName(op), "|",
                                   DTypeName(in.dtype()), "|", out->numel()),
                      true, opts);
  return Recorded(call, in.nbytes(), -1,
                  [&] { return DoReduceScatter(call, in, *out, op); });
}

std::shared_ptr<Work> ProcessGroup::Broadcast(Tensor* t, int root,
                                              const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("Broadcast on rank ", rank_, " of group '", name_, "'");
  if (t == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null tensor"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(*t, what, "in/out"));
  if (root < 0 || root >= size_) {
    return Work::Done(absl::InvalidArgumentError(absl::StrCat(
        what, ": root ", root, " is not a rank of a group of ", size_)));
  }
  MCC_BEGIN_OR_RETURN(
      call, "Broadcast",
      absl::StrCat("Broadcast(", TensorSig(*t), ", root ", root, ")"),
      absl::StrCat("Broadcast|", DTypeName(t->dtype()), "|", t->numel(), "|",
                   root),
      true, opts);
  return Recorded(call, t->nbytes(), -1,
                  [&] { return DoBroadcast(call, *t, root); });
}

std::shared_ptr<Work> ProcessGroup::AllToAll(const Tensor& in, Tensor* out,
                                             const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("AllToAll on rank ", rank_, " of group '", name_, "'");
  if (out == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null output"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(in, what, "input"));
  MCC_CHECK_OR_RETURN(CheckTensor(*out, what, "output"));
  if (out->dtype() != in.dtype() || out->shape() != in.shape() ||
      in.dim() == 0 || in.size(0) % size_ != 0) {
    return Work::Done(absl::InvalidArgumentError(absl::StrCat(
        what, ": input ", TensorSig(in), " and output ", TensorSig(*out),
        " must have the same dtype and shape, with dim 0 divisible by the "
        "group size ",
        size_)));
  }
  MCC_BEGIN_OR_RETURN(
      call, "AllToAll", absl::StrCat("AllToAll(", TensorSig(in), ")"),
      absl::StrCat("AllToAll|", DTypeName(in.dtype()), "|", in.numel()), true,
      opts);
  return Recorded(call, in.nbytes(), -1,
                  [&] { return DoAllToAll(call, in, *out); });
}

std::shared_ptr<Work> ProcessGroup::Barrier(const CollectiveOptions& opts) {
  MCC_BEGIN_OR_RETURN(call, "Barrier", "Barrier()", "Barrier", true, opts);
  return Recorded(call, 0, -1, [&] { return DoBarrier(call); });
}

std::shared_ptr<Work> ProcessGroup::Send(const Tensor& t, int dst, uint32_t tag,
                                         const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("Send on rank ", rank_, " of group '", name_, "'");
  MCC_CHECK_OR_RETURN(CheckTensor(t, what, "input"));
  if (dst < 0 || dst >= size_ || dst == rank_) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": destination ", dst,
                     " must be another rank of a group of ", size_)));
  }
  MCC_BEGIN_OR_RETURN(
      call, "Send",
      absl::StrCat("Send(", TensorSig(t), " to rank ", dst, ", tag ", tag, ")"),
      "", false, opts);
  return Recorded(call, t.nbytes(), global_ranks_[dst],
                  [&] { return DoSend(call, t, dst, tag); });
}

std::shared_ptr<Work> ProcessGroup::Recv(Tensor* t, int src, uint32_t tag,
                                         const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("Recv on rank ", rank_, " of group '", name_, "'");
  if (t == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null tensor"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(*t, what, "output"));
  if (src < 0 || src >= size_ || src == rank_) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": source ", src,
                     " must be another rank of a group of ", size_)));
  }
  MCC_BEGIN_OR_RETURN(call, "Recv",
                      absl::StrCat("Recv(", TensorSig(*t), " from rank ", src,
                                   ", tag ", tag, ")"),
                      "", false, opts);
  return Recorded(call, t->nbytes(), global_ranks_[src],
                  [&] { return DoRecv(call, *t, src, tag); });
}

std::shared_ptr<Work> ProcessGroup::BatchP2P(std::vector<P2POp> ops,
                                             const CollectiveOptions& opts) {
  if (ops.empty()) return Work::Done(absl::OkStatus());
  const std::string what =
      absl::StrCat("BatchP2P on rank ", rank_, " of group '", name_, "'");
  std::vector<std::string> parts;
  int64_t bytes = 0;
  int peer = -2;  // The one peer of every op, or -1.
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const bool send = op.kind == P2POp::kSend;
    const std::string op_what = absl::StrCat(what, ", op ", i);
    MCC_CHECK_OR_RETURN(
        CheckTensor(op.tensor, op_what, send ? "input" : "output"));
    if (op.peer < 0 || op.peer >= size_ || op.peer == rank_) {
      return Work::Done(absl::InvalidArgumentError(absl::StrCat(
          op_what, ": ", send ? "destination " : "source ", op.peer,
          " must be another rank of a group of ", size_)));
    }
    parts.push_back(absl::StrCat(send ? "Send(" : "Recv(", TensorSig(op.tensor),
                                 send ? " to rank " : " from rank ", op.peer,
                                 ", tag ", op.tag, ")"));
    bytes += op.tensor.nbytes();
    peer = peer == -2 || peer == op.peer ? op.peer : -1;
  }
  MCC_BEGIN_OR_RETURN(
      call, "BatchP2P",
      absl::StrCat("BatchP2P(", absl::StrJoin(parts, ", "), ")"), "", false,
      opts);
  return Recorded(call, bytes, peer >= 0 ? global_ranks_[peer] : -1,
                  [&] { return DoBatchP2P(call, std::move(ops)); });
}

std::shared_ptr<Work> ProcessGroup::DoBatchP2P(const Call& call,
                                               std::vector<P2POp> ops) {
  std::vector<std::shared_ptr<Work>> works;
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const bool send = op.kind == P2POp::kSend;
    Call sub = call;
    sub.op = send ? "Send" : "Recv";
    sub.what = absl::StrCat(call.what, ", op ", i, " (", sub.op,
                            send ? " to rank " : " from rank ", op.peer, ")");
    works.push_back(send ? DoSend(sub, op.tensor, op.peer, op.tag)
                         : DoRecv(sub, op.tensor, op.peer, op.tag));
  }
  return Work::All(call.what, call.timeout, std::move(works));
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> ProcessGroup::NewSubgroup(
    std::vector<int> ranks, const GroupOptions* options) {
  const std::string list = absl::StrJoin(ranks, ",");
  const std::string what = absl::StrCat("NewSubgroup([", list, "]) on rank ",
                                        rank_, " of group '", name_, "'");
  if (ranks.empty()) {
    return absl::InvalidArgumentError(what + ": empty rank list");
  }
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= size_ || !seen.insert(r).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ranks must be distinct ranks of this group (0..", size_ - 1,
          ")"));
    }
  }
  absl::StatusOr<Call> call =
      Begin("NewSubgroup", absl::StrCat("NewSubgroup([", list, "])"),
            absl::StrCat("NewSubgroup|", list), true, CollectiveOptions());
  if (!call.ok()) return call.status();
  const std::string sub_id = absl::StrCat("sub", subgroups_++);
  MCC_RETURN_IF_ERROR(
      store_->Set(absl::StrCat(sub_id, "/ranks/", rank_), list));
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return std::shared_ptr<ProcessGroup>();
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> mismatches;
  for (int q : sorted) {
    if (q == rank_) continue;
    absl::StatusOr<std::string> theirs =
        store_->Get(absl::StrCat(sub_id, "/ranks/", q), call->timeout);
    if (!theirs.ok()) {
      return Fail(*call, theirs.status().code(),
                  absl::StrCat("rank ", q, " did not create the subgroup: ",
                               theirs.status().message()));
    }
    if (*theirs != list) {
      mismatches.push_back(
          absl::StrCat("rank ", q, " called NewSubgroup([", *theirs, "])"));
    }
  }
  if (!mismatches.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "subgroup mismatch in group '", name_, "': this rank ", rank_,
        " called NewSubgroup([", list, "]) but ",
        absl::StrJoin(mismatches, "; "),
        "; every rank must pass the same ranks in the same order"));
  }
  std::vector<int> global;
  for (int r : ranks) global.push_back(global_ranks_[r]);
  GroupOptions sub_options = options != nullptr ? *options : options_;
  if (sub_options.liveness_store == nullptr) {
    sub_options.liveness_store = options_.liveness_store;
  }
  auto sub_store = std::make_shared<PrefixStore>(
      absl::StrCat(sub_id, "[", list, "]"), store_);
  return CreateSubgroup(
      static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()),
      absl::StrCat(name_, "/", sub_id, "[", list, "]"), std::move(global),
      std::move(sub_store), std::move(sub_options));
}

}  // namespace comm
}  // namespace mcc
