#include "core/comm/process_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/comm/backend.h"
#include "core/comm/call_observer.h"
#include "core/comm/flight_recorder.h"
#include "core/status_macros.h"

namespace mcc {
namespace comm {
namespace {

// SetDebugCollectivesDefault's setting.
std::atomic<bool> g_debug_collectives{false};

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

void SetDebugCollectivesDefault(bool on) { g_debug_collectives.store(on); }

bool DebugCollectivesDefault() {
  if (g_debug_collectives.load()) return true;
  const char* v = std::getenv("MCC_DEBUG_COLLECTIVES");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

ProcessGroup::ProcessGroup(std::unique_ptr<Backend> backend)
    : backend_(std::move(backend)) {}

ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return backend_->rank(); }
int ProcessGroup::size() const { return backend_->size(); }
const std::string& ProcessGroup::name() const { return backend_->name(); }
const std::vector<int>& ProcessGroup::global_ranks() const {
  return backend_->global_ranks();
}
absl::string_view ProcessGroup::backend() const { return backend_->type(); }
Device ProcessGroup::device() const { return backend_->device(); }
const GroupOptions& ProcessGroup::options() const {
  return backend_->options();
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
        backend(), " backend of group '", name(), "' moves tensors on ",
        device().ToString(), " only",
        device().is_cpu() ? " (use an NCCL group for CUDA tensors)"
                          : " (use a gloo group for CPU tensors)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Call> ProcessGroup::Begin(std::string op, std::string signature,
                                         std::string fingerprint,
                                         bool collective,
                                         const CollectiveOptions& opts) {
  Call call;
  call.op = std::move(op);
  call.signature = std::move(signature);
  call.fingerprint = std::move(fingerprint);
  call.timeout =
      opts.timeout > absl::ZeroDuration() ? opts.timeout : options().timeout;
  if (collective) {
    call.seq = seq_++;
    call.what = absl::StrCat(call.signature, " (sequence number ", call.seq,
                             ") in group '", name(), "' on rank ", rank(),
                             " of ", size());
  } else {
    call.p2p_index = p2p_seq_++;
    call.what =
        absl::StrCat(call.signature, " (p2p #", call.p2p_index, ") in group '",
                     name(), "' on rank ", rank(), " of ", size());
  }
  absl::Status broken = backend_->broken_status();
  if (!broken.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(call.what,
                     ": the group is unusable after an earlier "
                     "failure: ",
                     broken.message()));
  }
  if (collective && options().debug_collectives && size() > 1) {
    MCC_RETURN_IF_ERROR(CheckFingerprints(call));
  }
  return call;
}

std::shared_ptr<Work> ProcessGroup::Recorded(
    const Call& call, int64_t bytes, int peer,
    const std::function<std::shared_ptr<Work>()>& run) {
  FlightRecord record;
  record.group = name();
  record.group_ranks = global_ranks();
  record.global_rank = global_ranks()[rank()];
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
    observed = observer->OnIssue({name(), call.op, call.signature, call.seq,
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
  MCC_RETURN_IF_ERROR(backend_->store()->Set(
      absl::StrCat(prefix, rank()), call.fingerprint + "\n" + call.signature));
  std::vector<std::string> mismatches;
  for (int q = 0; q < size(); ++q) {
    if (q == rank()) continue;
    absl::StatusOr<std::string> theirs =
        backend_->store()->Get(absl::StrCat(prefix, q), call.timeout);
    if (!theirs.ok()) {
      return backend_->Fail(
          call, theirs.status().code(),
          absl::StrCat(
              "collective check (debug collectives): rank ", q,
              " did not reach this collective: ", theirs.status().message()));
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
    backend_->store()
        ->Delete(absl::StrCat("fp/", call.seq - 1, "/", rank()))
        .IgnoreError();
  }
  if (!mismatches.empty()) {
    absl::Status status = absl::InvalidArgumentError(
        absl::StrCat("collective mismatch in group '", name(),
                     "' at sequence number ", call.seq,
                     " (detected by debug collectives before any data moved): "
                     "this rank ",
                     rank(), " called ", call.signature, " but ",
                     absl::StrJoin(mismatches, "; ")));
    backend_->Break(status);
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
      absl::StrCat("AllReduce on rank ", rank(), " of group '", name(), "'");
  MCC_CHECK_OR_RETURN(CheckTensor(*t, what, "in/out"));
  MCC_BEGIN_OR_RETURN(
      call, "AllReduce",
      absl::StrCat("AllReduce(", ReduceOpName(op), ", ", TensorSig(*t), ")"),
      absl::StrCat("AllReduce|", ReduceOpName(op), "|", DTypeName(t->dtype()),
                   "|", t->numel()),
      true, opts);
  return Recorded(call, t->nbytes(), -1,
                  [&] { return backend_->DoAllReduce(call, *t, op); });
}

std::shared_ptr<Work> ProcessGroup::AllGather(const Tensor& in, Tensor* out,
                                              const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("AllGather on rank ", rank(), " of group '", name(), "'");
  if (out == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null output"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(in, what, "input"));
  MCC_CHECK_OR_RETURN(CheckTensor(*out, what, "output"));
  const Shape expected = WithDim0(in.shape(), Rows(in) * size());
  if (out->dtype() != in.dtype() || out->shape() != expected) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": output is ", TensorSig(*out), " but must be ",
                     DTypeName(in.dtype()), ShapeToString(expected), " (",
                     size(), " x input ", TensorSig(in), " along dim 0)")));
  }
  MCC_BEGIN_OR_RETURN(
      call, "AllGather",
      absl::StrCat("AllGather(", TensorSig(in), " -> ", TensorSig(*out), ")"),
      absl::StrCat("AllGather|", DTypeName(in.dtype()), "|", in.numel()), true,
      opts);
  return Recorded(call, out->nbytes(), -1,
                  [&] { return backend_->DoAllGather(call, in, *out); });
}

std::shared_ptr<Work> ProcessGroup::AllGatherV(
    const Tensor& in, Tensor* out, const std::vector<int64_t>& rows_per_rank,
    const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("AllGatherV on rank ", rank(), " of group '", name(), "'");
  if (out == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null output"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(in, what, "input"));
  MCC_CHECK_OR_RETURN(CheckTensor(*out, what, "output"));
  if (static_cast<int>(rows_per_rank.size()) != size()) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": rows_per_rank has ", rows_per_rank.size(),
                     " entries for a group of ", size())));
  }
  int64_t total = 0;
  for (int64_t r : rows_per_rank) {
    if (r < 0) {
      return Work::Done(absl::InvalidArgumentError(
          absl::StrCat(what, ": negative entry in rows_per_rank")));
    }
    total += r;
  }
  if (in.dim() == 0 || in.size(0) != rows_per_rank[rank()]) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": input is ", TensorSig(in), " but rows_per_rank[",
                     rank(), "] = ", rows_per_rank[rank()])));
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
    return backend_->DoAllGatherV(call, in, *out, std::move(elements));
  });
}

std::shared_ptr<Work> ProcessGroup::ReduceScatter(
    const Tensor& in, Tensor* out, ReduceOp op, const CollectiveOptions& opts) {
  const std::string what = absl::StrCat("ReduceScatter on rank ", rank(),
                                        " of group '", name(), "'");
  if (out == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null output"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(in, what, "input"));
  MCC_CHECK_OR_RETURN(CheckTensor(*out, what, "output"));
  const Shape expected = WithDim0(out->shape(), Rows(*out) * size());
  if (out->dtype() != in.dtype() || in.shape() != expected) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": input is ", TensorSig(in), " but must be ",
                     DTypeName(out->dtype()), ShapeToString(expected), " (",
                     size(), " x output ", TensorSig(*out), " along dim 0)")));
  }
  MCC_BEGIN_OR_RETURN(call, "ReduceScatter",
                      absl::StrCat("ReduceScatter(", ReduceOpName(op), ", ",
                                   TensorSig(in), " -> ", TensorSig(*out), ")"),
                      absl::StrCat("ReduceScatter|", ReduceOpName(op), "|",
                                   DTypeName(in.dtype()), "|", out->numel()),
                      true, opts);
  return Recorded(call, in.nbytes(), -1, [&] {
    return backend_->DoReduceScatter(call, in, *out, op);
  });
}

std::shared_ptr<Work> ProcessGroup::Broadcast(Tensor* t, int root,
                                              const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("Broadcast on rank ", rank(), " of group '", name(), "'");
  if (t == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null tensor"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(*t, what, "in/out"));
  if (root < 0 || root >= size()) {
    return Work::Done(absl::InvalidArgumentError(absl::StrCat(
        what, ": root ", root, " is not a rank of a group of ", size())));
  }
  MCC_BEGIN_OR_RETURN(
      call, "Broadcast",
      absl::StrCat("Broadcast(", TensorSig(*t), ", root ", root, ")"),
      absl::StrCat("Broadcast|", DTypeName(t->dtype()), "|", t->numel(), "|",
                   root),
      true, opts);
  return Recorded(call, t->nbytes(), -1,
                  [&] { return backend_->DoBroadcast(call, *t, root); });
}

std::shared_ptr<Work> ProcessGroup::AllToAll(const Tensor& in, Tensor* out,
                                             const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("AllToAll on rank ", rank(), " of group '", name(), "'");
  if (out == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null output"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(in, what, "input"));
  MCC_CHECK_OR_RETURN(CheckTensor(*out, what, "output"));
  if (out->dtype() != in.dtype() || out->shape() != in.shape() ||
      in.dim() == 0 || in.size(0) % size() != 0) {
    return Work::Done(absl::InvalidArgumentError(absl::StrCat(
        what, ": input ", TensorSig(in), " and output ", TensorSig(*out),
        " must have the same dtype and shape, with dim 0 divisible by the "
        "group size ",
        size())));
  }
  MCC_BEGIN_OR_RETURN(
      call, "AllToAll", absl::StrCat("AllToAll(", TensorSig(in), ")"),
      absl::StrCat("AllToAll|", DTypeName(in.dtype()), "|", in.numel()), true,
      opts);
  return Recorded(call, in.nbytes(), -1,
                  [&] { return backend_->DoAllToAll(call, in, *out); });
}

std::shared_ptr<Work> ProcessGroup::Barrier(const CollectiveOptions& opts) {
  MCC_BEGIN_OR_RETURN(call, "Barrier", "Barrier()", "Barrier", true, opts);
  return Recorded(call, 0, -1, [&] { return backend_->DoBarrier(call); });
}

std::shared_ptr<Work> ProcessGroup::Send(const Tensor& t, int dst, uint32_t tag,
                                         const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("Send on rank ", rank(), " of group '", name(), "'");
  MCC_CHECK_OR_RETURN(CheckTensor(t, what, "input"));
  if (dst < 0 || dst >= size() || dst == rank()) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": destination ", dst,
                     " must be another rank of a group of ", size())));
  }
  MCC_BEGIN_OR_RETURN(
      call, "Send",
      absl::StrCat("Send(", TensorSig(t), " to rank ", dst, ", tag ", tag, ")"),
      "", false, opts);
  return Recorded(call, t.nbytes(), global_ranks()[dst],
                  [&] { return backend_->DoSend(call, t, dst, tag); });
}

std::shared_ptr<Work> ProcessGroup::Recv(Tensor* t, int src, uint32_t tag,
                                         const CollectiveOptions& opts) {
  const std::string what =
      absl::StrCat("Recv on rank ", rank(), " of group '", name(), "'");
  if (t == nullptr) {
    return Work::Done(absl::InvalidArgumentError(what + ": null tensor"));
  }
  MCC_CHECK_OR_RETURN(CheckTensor(*t, what, "output"));
  if (src < 0 || src >= size() || src == rank()) {
    return Work::Done(absl::InvalidArgumentError(
        absl::StrCat(what, ": source ", src,
                     " must be another rank of a group of ", size())));
  }
  MCC_BEGIN_OR_RETURN(call, "Recv",
                      absl::StrCat("Recv(", TensorSig(*t), " from rank ", src,
                                   ", tag ", tag, ")"),
                      "", false, opts);
  return Recorded(call, t->nbytes(), global_ranks()[src],
                  [&] { return backend_->DoRecv(call, *t, src, tag); });
}

std::shared_ptr<Work> ProcessGroup::BatchP2P(std::vector<P2POp> ops,
                                             const CollectiveOptions& opts) {
  if (ops.empty()) return Work::Done(absl::OkStatus());
  const std::string what =
      absl::StrCat("BatchP2P on rank ", rank(), " of group '", name(), "'");
  std::vector<std::string> parts;
  int64_t bytes = 0;
  int peer = -2;  // The one peer of every op, or -1.
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const bool send = op.kind == P2POp::kSend;
    const std::string op_what = absl::StrCat(what, ", op ", i);
    MCC_CHECK_OR_RETURN(
        CheckTensor(op.tensor, op_what, send ? "input" : "output"));
    if (op.peer < 0 || op.peer >= size() || op.peer == rank()) {
      return Work::Done(absl::InvalidArgumentError(absl::StrCat(
          op_what, ": ", send ? "destination " : "source ", op.peer,
          " must be another rank of a group of ", size())));
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
  return Recorded(call, bytes, peer >= 0 ? global_ranks()[peer] : -1,
                  [&] { return backend_->DoBatchP2P(call, std::move(ops)); });
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> ProcessGroup::NewSubgroup(
    std::vector<int> ranks, const GroupOptions* options) {
  const std::string list = absl::StrJoin(ranks, ",");
  const std::string what = absl::StrCat("NewSubgroup([", list, "]) on rank ",
                                        rank(), " of group '", name(), "'");
  if (ranks.empty()) {
    return absl::InvalidArgumentError(what + ": empty rank list");
  }
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= size() || !seen.insert(r).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ranks must be distinct ranks of this group (0..", size() - 1,
          ")"));
    }
  }
  absl::StatusOr<Call> call =
      Begin("NewSubgroup", absl::StrCat("NewSubgroup([", list, "])"),
            absl::StrCat("NewSubgroup|", list), true, CollectiveOptions());
  if (!call.ok()) return call.status();
  const std::string sub_id = absl::StrCat("sub", subgroups_++);
  MCC_RETURN_IF_ERROR(
      backend_->store()->Set(absl::StrCat(sub_id, "/ranks/", rank()), list));
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  if (it == ranks.end()) return std::shared_ptr<ProcessGroup>();
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> mismatches;
  for (int q : sorted) {
    if (q == rank()) continue;
    absl::StatusOr<std::string> theirs = backend_->store()->Get(
        absl::StrCat(sub_id, "/ranks/", q), call->timeout);
    if (!theirs.ok()) {
      return backend_->Fail(
          *call, theirs.status().code(),
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
        "subgroup mismatch in group '", name(), "': this rank ", rank(),
        " called NewSubgroup([", list, "]) but ",
        absl::StrJoin(mismatches, "; "),
        "; every rank must pass the same ranks in the same order"));
  }
  std::vector<int> global;
  for (int r : ranks) global.push_back(global_ranks()[r]);
  const GroupOptions& own = backend_->options();
  GroupOptions sub_options = options != nullptr ? *options : own;
  if (sub_options.liveness_store == nullptr) {
    sub_options.liveness_store = own.liveness_store;
  }
  auto sub_store = std::make_shared<PrefixStore>(
      absl::StrCat(sub_id, "[", list, "]"), backend_->store());
  MCC_ASSIGN_OR_RETURN(
      std::unique_ptr<Backend> sub,
      backend_->CreateSubgroup(
          static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()),
          absl::StrCat(name(), "/", sub_id, "[", list, "]"), std::move(global),
          std::move(sub_store), std::move(sub_options)));
  return std::make_shared<ProcessGroup>(std::move(sub));
}

}  // namespace comm
}  // namespace mcc
