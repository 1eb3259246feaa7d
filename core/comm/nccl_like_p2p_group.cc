#include "core/comm/nccl_like_p2p_group.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/backend.h"
#include "core/comm/serial_queue.h"

namespace mcc {
namespace comm {
namespace {

// Every payload travels under one tag and every acknowledgement under
// another, so the inner (gloo) group matches them per peer in posting order.
constexpr uint32_t kDataTag = 0x4E430001;
constexpr uint32_t kAckTag = 0x4E430002;

GroupOptions WrapperOptions(const ProcessGroup* inner) {
  GroupOptions o = inner->options();
  o.debug_collectives = false;  // The inner group checks its own calls.
  o.device = inner->device();
  return o;
}

}  // namespace

// The wrapper's transport: every operation runs on one serial worker, over
// the inner group.
class NcclLikeP2PBackend : public Backend {
 public:
  explicit NcclLikeP2PBackend(ProcessGroup* inner);
  ~NcclLikeP2PBackend() override;

  absl::string_view type() const override { return type_; }
  Device device() const override { return inner_->device(); }

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
  // Runs fn on the serial worker after everything posted before it; the
  // work finishes with fn's status.
  std::shared_ptr<Work> Serialized(const Call& call,
                                   std::function<absl::Status()> fn);
  // The transfers of one batch over the inner group, with rendezvous.
  absl::Status RunTransfers(const Call& call, const std::vector<P2POp>& ops);

  ProcessGroup* inner_;
  std::string type_;
  std::unique_ptr<SerialQueue> queue_;
};

NcclLikeP2PBackend::NcclLikeP2PBackend(ProcessGroup* inner)
    : Backend(inner->rank(), inner->size(),
              absl::StrCat(inner->name(), "/nccl-like"), inner->global_ranks(),
              nullptr, WrapperOptions(inner)),
      inner_(inner),
      type_(absl::StrCat("nccl-like(", inner->backend(), ")")),
      queue_(new SerialQueue) {}

NcclLikeP2PBackend::~NcclLikeP2PBackend() { queue_.reset(); }

std::shared_ptr<Work> NcclLikeP2PBackend::Serialized(
    const Call& call, std::function<absl::Status()> fn) {
  auto work = std::make_shared<Work>(call.what, call.timeout);
  queue_->Push([work, call, fn = std::move(fn)] {
    absl::Status s = fn();
    if (!s.ok()) {
      s = absl::Status(s.code(), absl::StrCat(call.what, ": ", s.message()));
    }
    work->MarkDone(std::move(s));
  });
  return work;
}

absl::Status NcclLikeP2PBackend::RunTransfers(const Call& call,
                                              const std::vector<P2POp>& ops) {
  CollectiveOptions opts;
  opts.timeout = call.timeout;
  const Device device = inner_->device();
  std::vector<std::shared_ptr<Work>> posted;
  std::vector<std::pair<std::shared_ptr<Work>, int>> recvs;  // With the peer.
  // Payloads, and the receivers' acknowledgements of this rank's sends, all
  // posted at once as NCCL's group posts them.
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::kSend) {
      posted.push_back(inner_->Send(op.tensor, op.peer, kDataTag, opts));
      Tensor ack = Tensor::Zeros({1}, DType::kInt32, device);
      posted.push_back(inner_->Recv(&ack, op.peer, kAckTag, opts));
    } else {
      Tensor into = op.tensor;
      recvs.emplace_back(inner_->Recv(&into, op.peer, kDataTag, opts), op.peer);
    }
  }
  for (const auto& [recv, peer] : recvs) {
    absl::Status s = recv->Wait();
    if (!s.ok()) return s;
    // Tells the sender its transfer has arrived.
    Tensor ack = Tensor::Zeros({1}, DType::kInt32, device);
    posted.push_back(inner_->Send(ack, peer, kAckTag, opts));
  }
  for (const auto& w : posted) {
    absl::Status s = w->Wait();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::shared_ptr<Work> NcclLikeP2PBackend::DoSend(const Call& call, Tensor t,
                                                 int dst, uint32_t) {
  return DoBatchP2P(call, {P2POp::Send(std::move(t), dst)});
}

std::shared_ptr<Work> NcclLikeP2PBackend::DoRecv(const Call& call, Tensor t,
                                                 int src, uint32_t) {
  return DoBatchP2P(call, {P2POp::Recv(std::move(t), src)});
}

std::shared_ptr<Work> NcclLikeP2PBackend::DoBatchP2P(const Call& call,
                                                     std::vector<P2POp> ops) {
  return Serialized(call, [this, call, ops = std::move(ops)] {
    return RunTransfers(call, ops);
  });
}

namespace {

CollectiveOptions Timeout(const Call& call) {
  CollectiveOptions o;
  o.timeout = call.timeout;
  return o;
}

}  // namespace

std::shared_ptr<Work> NcclLikeP2PBackend::DoAllReduce(const Call& call,
                                                      Tensor t, ReduceOp op) {
  return Serialized(call, [this, call, t, op]() mutable {
    return inner_->AllReduceSync(&t, op, Timeout(call));
  });
}

std::shared_ptr<Work> NcclLikeP2PBackend::DoAllGather(const Call& call,
                                                      Tensor in, Tensor out) {
  return Serialized(call, [this, call, in, out]() mutable {
    return inner_->AllGatherSync(in, &out, Timeout(call));
  });
}

std::shared_ptr<Work> NcclLikeP2PBackend::DoAllGatherV(
    const Call& call, Tensor in, Tensor out,
    std::vector<int64_t> elements_per_rank) {
  // Back from elements to rows (dim 0) for the public entry point.
  const int64_t row =
      in.dim() == 0 || in.size(0) == 0 ? 1 : in.numel() / in.size(0);
  std::vector<int64_t> rows;
  for (int64_t e : elements_per_rank) rows.push_back(row > 0 ? e / row : 0);
  return Serialized(call, [this, call, in, out, rows]() mutable {
    return inner_->AllGatherVSync(in, &out, rows, Timeout(call));
  });
}

std::shared_ptr<Work> NcclLikeP2PBackend::DoReduceScatter(const Call& call,
                                                          Tensor in, Tensor out,
                                                          ReduceOp op) {
  return Serialized(call, [this, call, in, out, op]() mutable {
    return inner_->ReduceScatterSync(in, &out, op, Timeout(call));
  });
}

std::shared_ptr<Work> NcclLikeP2PBackend::DoBroadcast(const Call& call,
                                                      Tensor t, int root) {
  return Serialized(call, [this, call, t, root]() mutable {
    return inner_->BroadcastSync(&t, root, Timeout(call));
  });
}

std::shared_ptr<Work> NcclLikeP2PBackend::DoAllToAll(const Call& call,
                                                     Tensor in, Tensor out) {
  return Serialized(call, [this, call, in, out]() mutable {
    return inner_->AllToAllSync(in, &out, Timeout(call));
  });
}

std::shared_ptr<Work> NcclLikeP2PBackend::DoBarrier(const Call& call) {
  return Serialized(
      call, [this, call] { return inner_->BarrierSync(Timeout(call)); });
}

absl::StatusOr<std::unique_ptr<Backend>> NcclLikeP2PBackend::CreateSubgroup(
    int, int, std::string, std::vector<int>, std::shared_ptr<Store>,
    GroupOptions) {
  return absl::UnimplementedError(
      absl::StrCat("group '", name(),
                   "': subgroups of the NCCL-like test "
                   "wrapper are not supported (wrap the inner group's)"));
}

std::unique_ptr<ProcessGroup> MakeNcclLikeP2PGroup(ProcessGroup* inner) {
  return std::make_unique<ProcessGroup>(
      std::make_unique<NcclLikeP2PBackend>(inner));
}

}  // namespace comm
}  // namespace mcc
