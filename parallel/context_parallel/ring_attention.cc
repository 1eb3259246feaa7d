#include "parallel/context_parallel/ring_attention.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/status_macros.h"
#include "parallel/context_parallel/chunk_layout.h"
#include "parallel/context_parallel/softmax_merge.h"

namespace mcc {
namespace context_parallel {
namespace {

struct Ring {
  int size = 1, rank = 0;
  comm::ProcessGroup* group = nullptr;  // Null when alone.
  int Next() const { return (rank + 1) % size; }
  int Prev() const { return (rank + size - 1) % size; }
  // Whose blocks this rank holds at ring step `step`.
  int Source(int step) const { return (rank - step % size + size) % size; }
};

Ring RingOf(comm::ProcessGroup* group) {
  Ring r;
  if (group != nullptr && group->size() > 1) {
    r.size = group->size();
    r.rank = group->rank();
    r.group = group;
  }
  return r;
}

// How query chunk gq sees key chunk gk: all of it (earlier), causally (the
// same chunk) or not at all (later).
enum class Visibility { kFull, kCausal, kNone };
Visibility See(int gq, int gk) {
  if (gk < gq) return Visibility::kFull;
  return gk == gq ? Visibility::kCausal : Visibility::kNone;
}

// The first keys of query chunk gq (global, [b, S]) in the coordinates of
// key chunk gk (chunks of l tokens): int32 [b, l]; undefined without a
// first_key. *skip: no query of the chunk sees any key of that chunk.
Tensor ChunkFirstKeys(const Tensor& first_key, int gq, int gk, int64_t l,
                      bool* skip) {
  *skip = false;
  if (!first_key.defined()) return Tensor();
  const int64_t b = first_key.size(0), s = first_key.size(1);
  Tensor out = Tensor::Empty({b, l}, DType::kInt32);
  const int32_t* src = first_key.data<int32_t>();
  int32_t* dst = out.data<int32_t>();
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < l; ++i) {
      const int64_t f = src[bi * s + gq * l + i];
      smallest = std::min(smallest, f);
      dst[bi * l + i] = static_cast<int32_t>(f - gk * l);
    }
  }
  *skip = smallest >= (gk + 1) * l;
  return out;
}

absl::Status CheckFirstKey(const char* op, const QkvChunks& in, int ring) {
  const Tensor& f = in.first_key;
  if (!f.defined()) return absl::OkStatus();
  const int64_t b = in.q[0].size(0), s = 2 * ring * in.q[0].size(1);
  if (f.dtype() != DType::kInt32 || !f.device().is_cpu() ||
      f.shape() != Shape{b, s}) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": first_key ", f.Describe(),
        " (packed documents / sliding window) must be int32 [batch, "
        "sequence] = ",
        ShapeToString({b, s}), " on the host"));
  }
  return absl::OkStatus();
}

absl::Status CheckChunks(const char* op, const QkvChunks& in) {
  for (int c = 0; c < 2; ++c) {
    for (const Tensor* t : {&in.q[c], &in.k[c], &in.v[c]}) {
      if (!t->defined() || t->dim() != 4) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": chunk ", c, " tensor ", t->Describe(),
                         " must be [batch, chunk_length, heads, head_dim]"));
      }
    }
    if (in.q[c].shape() != in.q[0].shape() ||
        in.k[c].shape() != in.k[0].shape() ||
        in.v[c].shape() != in.k[0].shape() ||
        in.k[c].size(1) != in.q[c].size(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": chunks must share one shape, q ", in.q[c].Describe(), ", k ",
          in.k[c].Describe(), ", v ", in.v[c].Describe()));
    }
  }
  return absl::OkStatus();
}

// The two key and value chunks of one rank in one buffer [4, b, L, kv, d]
// (k0, k1, v0, v1), so a ring step moves them with one transfer.
struct KvBlock {
  Tensor buffer;
  std::array<Tensor, 4> parts;  // Views: k0, k1, v0, v1.
  const Tensor& k(int c) const { return parts[c]; }
  const Tensor& v(int c) const { return parts[2 + c]; }
};

absl::StatusOr<KvBlock> NewBlock(const Shape& shape, DType dtype,
                                 Device device) {
  KvBlock b;
  Shape full{4};
  full.insert(full.end(), shape.begin(), shape.end());
  b.buffer = Tensor::Empty(full, dtype, device);
  for (int i = 0; i < 4; ++i) {
    MCC_ASSIGN_OR_RETURN(Tensor slice, b.buffer.Slice(i, i + 1));
    MCC_ASSIGN_OR_RETURN(b.parts[i], slice.Reshape(shape));
  }
  return b;
}

// Posts this step's transfer: `send` to the next rank, `recv` from the
// previous one. Waits in Finish.
struct Transfer {
  std::shared_ptr<comm::Work> send, recv;
  absl::Status Finish(RingTimes* times) {
    const absl::Time start = absl::Now();
    absl::Status s = absl::OkStatus();
    if (send != nullptr) s.Update(send->Wait());
    if (recv != nullptr) s.Update(recv->Wait());
    send.reset();
    recv.reset();
    if (times != nullptr) {
      times->wait_seconds += absl::ToDoubleSeconds(absl::Now() - start);
    }
    return s;
  }
};

Transfer Post(const Ring& ring, const Tensor& send, Tensor* recv,
              uint32_t tag) {
  Transfer t;
  // Receive first: the peer's send may already be on its way.
  t.recv = ring.group->Recv(recv, ring.Prev(), tag);
  t.send = ring.group->Send(send, ring.Next(), tag);
  return t;
}

class ComputeTimer {
 public:
  explicit ComputeTimer(RingTimes* times) : times_(times) {}
  ~ComputeTimer() {
    if (times_ != nullptr) {
      times_->compute_seconds += absl::ToDoubleSeconds(absl::Now() - start_);
    }
  }

 private:
  RingTimes* times_;
  absl::Time start_ = absl::Now();
};

}  // namespace

absl::Status RingAttentionForward(comm::ProcessGroup* group,
                                  const QkvChunks& in, float softmax_scale,
                                  ChunkPair* out, ChunkPair* lse,
                                  RingTimes* times) {
  constexpr const char* op = "RingAttentionForward";
  MCC_RETURN_IF_ERROR(CheckChunks(op, in));
  if (times != nullptr) *times = RingTimes();
  const Ring ring = RingOf(group);
  MCC_RETURN_IF_ERROR(CheckFirstKey(op, in, ring.size));
  const Tensor& q0 = in.q[0];
  const Device device = q0.device();
  const int64_t b = q0.size(0), l = q0.size(1), h = q0.size(2);
  const Shape lse_shape{b, h, l};

  ChunkPair acc, acc_lse;
  for (int a = 0; a < 2; ++a) {
    acc[a] = Tensor::Empty(q0.shape(), DType::kFloat32, device);
    MCC_RETURN_IF_ERROR(ops::Fill(0.0, &acc[a]));
    acc_lse[a] = Tensor::Empty(lse_shape, DType::kFloat32, device);
    MCC_RETURN_IF_ERROR(
        ops::Fill(-std::numeric_limits<double>::infinity(), &acc_lse[a]));
  }
  Tensor part = Tensor::Empty(q0.shape(), DType::kFloat32, device);
  Tensor part_lse = Tensor::Empty(lse_shape, DType::kFloat32, device);

  MCC_ASSIGN_OR_RETURN(KvBlock cur,
                       NewBlock(in.k[0].shape(), q0.dtype(), device));
  MCC_ASSIGN_OR_RETURN(KvBlock next,
                       NewBlock(in.k[0].shape(), q0.dtype(), device));
  for (int c = 0; c < 2; ++c) {
    MCC_RETURN_IF_ERROR(ops::Convert(in.k[c], &cur.parts[c]));
    MCC_RETURN_IF_ERROR(ops::Convert(in.v[c], &cur.parts[2 + c]));
  }
  ops::AttentionOptions options;
  options.softmax_scale = softmax_scale;
  for (int step = 0; step < ring.size; ++step) {
    Transfer transfer;
    if (step + 1 < ring.size) {
      transfer = Post(ring, cur.buffer, &next.buffer, kKvTag);
    }
    {
      ComputeTimer timer(times);
      const int src = ring.Source(step);
      for (int a = 0; a < 2; ++a) {
        const int gq = ChunkLayout::GlobalChunk(ring.size, ring.rank, a);
        for (int c = 0; c < 2; ++c) {
          const int gk = ChunkLayout::GlobalChunk(ring.size, src, c);
          const Visibility vis = See(gq, gk);
          if (vis == Visibility::kNone) continue;
          bool skip = false;
          options.first_key = ChunkFirstKeys(in.first_key, gq, gk, l, &skip);
          if (skip) continue;  // Every query's document starts later.
          options.causal = vis == Visibility::kCausal;
          MCC_RETURN_IF_ERROR(ops::FlashAttentionForward(
              in.q[a], cur.k(c), cur.v(c), options, &part, &part_lse));
          MCC_RETURN_IF_ERROR(
              MergeAttentionPartial(part, part_lse, &acc[a], &acc_lse[a]));
        }
      }
    }
    MCC_RETURN_IF_ERROR(transfer.Finish(times));
    std::swap(cur, next);
  }
  for (int a = 0; a < 2; ++a) {
    (*out)[a] = Tensor::Empty(q0.shape(), q0.dtype(), device);
    MCC_RETURN_IF_ERROR(ops::Convert(acc[a], &(*out)[a]));
    (*lse)[a] = acc_lse[a];
  }
  return absl::OkStatus();
}

absl::Status RingAttentionBackward(comm::ProcessGroup* group,
                                   const QkvChunks& in, const ChunkPair& out,
                                   const ChunkPair& dout, const ChunkPair& lse,
                                   float softmax_scale, QkvChunks* grads,
                                   RingTimes* times) {
  constexpr const char* op = "RingAttentionBackward";
  MCC_RETURN_IF_ERROR(CheckChunks(op, in));
  if (times != nullptr) *times = RingTimes();
  const Ring ring = RingOf(group);
  MCC_RETURN_IF_ERROR(CheckFirstKey(op, in, ring.size));
  const Tensor& q0 = in.q[0];
  const Device device = q0.device();
  const Shape kv_shape = in.k[0].shape();
  const int64_t l = q0.size(1);

  ChunkPair dq_acc;
  for (int a = 0; a < 2; ++a) {
    dq_acc[a] = Tensor::Empty(q0.shape(), DType::kFloat32, device);
    MCC_RETURN_IF_ERROR(ops::Fill(0.0, &dq_acc[a]));
  }
  Tensor dq_part = Tensor::Empty(q0.shape(), DType::kFloat32, device);
  Tensor dk_part = Tensor::Empty(kv_shape, DType::kFloat32, device);
  Tensor dv_part = Tensor::Empty(kv_shape, DType::kFloat32, device);

  MCC_ASSIGN_OR_RETURN(KvBlock cur, NewBlock(kv_shape, q0.dtype(), device));
  MCC_ASSIGN_OR_RETURN(KvBlock next, NewBlock(kv_shape, q0.dtype(), device));
  // The key/value gradients of the block in `cur`, fp32, travelling with it.
  MCC_ASSIGN_OR_RETURN(KvBlock dcur,
                       NewBlock(kv_shape, DType::kFloat32, device));
  MCC_ASSIGN_OR_RETURN(KvBlock dnext,
                       NewBlock(kv_shape, DType::kFloat32, device));
  MCC_RETURN_IF_ERROR(ops::Fill(0.0, &dcur.buffer));
  for (int c = 0; c < 2; ++c) {
    MCC_RETURN_IF_ERROR(ops::Convert(in.k[c], &cur.parts[c]));
    MCC_RETURN_IF_ERROR(ops::Convert(in.v[c], &cur.parts[2 + c]));
  }
  ops::AttentionOptions options;
  options.softmax_scale = softmax_scale;
  Transfer grad_transfer;
  for (int step = 0; step < ring.size; ++step) {
    Transfer kv_transfer;
    if (step + 1 < ring.size) {
      kv_transfer = Post(ring, cur.buffer, &next.buffer, kKvTag);
    }
    const int src = ring.Source(step);
    for (int a = 0; a < 2; ++a) {
      const int gq = ChunkLayout::GlobalChunk(ring.size, ring.rank, a);
      for (int c = 0; c < 2; ++c) {
        const int gk = ChunkLayout::GlobalChunk(ring.size, src, c);
        const Visibility vis = See(gq, gk);
        if (vis == Visibility::kNone) continue;
        bool skip = false;
        options.first_key = ChunkFirstKeys(in.first_key, gq, gk, l, &skip);
        if (skip) continue;
        options.causal = vis == Visibility::kCausal;
        {
          ComputeTimer timer(times);
          MCC_RETURN_IF_ERROR(ops::FlashAttentionBackward(
              in.q[a], cur.k(c), cur.v(c), out[a], dout[a], lse[a], options,
              &dq_part, &dk_part, &dv_part));
          MCC_RETURN_IF_ERROR(ops::Accumulate(dq_part, 1.0f, &dq_acc[a]));
        }
        // This block's gradients arrive from the previous rank while the
        // first kernel runs; wait only before adding to them.
        MCC_RETURN_IF_ERROR(grad_transfer.Finish(times));
        ComputeTimer timer(times);
        MCC_RETURN_IF_ERROR(ops::Accumulate(dk_part, 1.0f, &dcur.parts[c]));
        MCC_RETURN_IF_ERROR(ops::Accumulate(dv_part, 1.0f, &dcur.parts[2 + c]));
      }
    }
    MCC_RETURN_IF_ERROR(grad_transfer.Finish(times));
    if (ring.size > 1) {
      // Pass the block's gradients on with it; the last step's send takes
      // them home.
      grad_transfer = Post(ring, dcur.buffer, &dnext.buffer, kGradTag);
    }
    MCC_RETURN_IF_ERROR(kv_transfer.Finish(times));
    if (ring.size > 1) {
      std::swap(cur, next);
      // dcur's buffer is being sent; the next step accumulates into dnext,
      // which the posted receive fills.
      std::swap(dcur, dnext);
    }
  }
  MCC_RETURN_IF_ERROR(grad_transfer.Finish(times));
  for (int c = 0; c < 2; ++c) {
    grads->q[c] = Tensor::Empty(q0.shape(), q0.dtype(), device);
    MCC_RETURN_IF_ERROR(ops::Convert(dq_acc[c], &grads->q[c]));
    grads->k[c] = Tensor::Empty(kv_shape, q0.dtype(), device);
    MCC_RETURN_IF_ERROR(ops::Convert(dcur.k(c), &grads->k[c]));
    grads->v[c] = Tensor::Empty(kv_shape, q0.dtype(), device);
    MCC_RETURN_IF_ERROR(ops::Convert(dcur.v(c), &grads->v[c]));
  }
  return absl::OkStatus();
}

}  // namespace context_parallel
}  // namespace mcc
