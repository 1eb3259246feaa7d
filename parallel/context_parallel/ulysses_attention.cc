#include "parallel/context_parallel/ulysses_attention.h"

#include "absl/strings/str_cat.h"
#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/layout.h"
#include "core/status_macros.h"
#include "parallel/context_parallel/chunk_layout.h"

namespace mcc {
namespace context_parallel {
namespace {

struct Group {
  comm::ProcessGroup* pg = nullptr;  // Null when alone.
  int size = 1, rank = 0;
};

Group GroupOf(comm::ProcessGroup* g) {
  Group r;
  if (g != nullptr && g->size() > 1) {
    r.pg = g;
    r.size = g->size();
    r.rank = g->rank();
  }
  return r;
}

absl::Status AllToAll(const Group& g, const Tensor& in, Tensor* out) {
  if (g.pg == nullptr) return ops::Convert(in, out);
  return g.pg->AllToAll(in, out)->Wait();
}

// A copy of `rows` x `run` elements between two strided places.
absl::Status CopyBlock(const Tensor& src, int64_t rows, int64_t run,
                       int64_t src_stride, int64_t src_offset,
                       int64_t dst_stride, int64_t dst_offset, Tensor* dst) {
  ops::StridedCopyPlan p;
  p.rank = 2;
  p.shape[0] = rows;
  p.shape[1] = run;
  p.src_strides[0] = src_stride;
  p.src_strides[1] = 1;
  p.dst_strides[0] = dst_stride;
  p.dst_strides[1] = 1;
  p.src_offset = src_offset;
  p.dst_offset = dst_offset;
  return ops::CopyStrided(src, p, dst);
}

// This rank's two chunks [b, L, H, d] of all H heads -> the whole sequence
// [b, 2CL, H / C, d] of head block `rank`.
absl::StatusOr<Tensor> SeqToHeads(const Group& g, const ChunkPair& x) {
  const int c = g.size;
  const int64_t b = x[0].size(0), l = x[0].size(1), h = x[0].size(2),
                d = x[0].size(3);
  const int64_t hc = h / c, run = hc * d, block = b * l * run;
  Tensor send = Tensor::Empty({c * 2 * block}, x[0].dtype(), x[0].device());
  for (int j = 0; j < c; ++j) {
    for (int a = 0; a < 2; ++a) {
      // Rows (batch, token) of head block j: h * d apart.
      MCC_RETURN_IF_ERROR(CopyBlock(x[a], b * l, run, h * d, j * run, run,
                                    (j * 2 + a) * block, &send));
    }
  }
  Tensor recv = Tensor::Empty(send.shape(), send.dtype(), send.device());
  MCC_RETURN_IF_ERROR(AllToAll(g, send, &recv));
  const int64_t s = 2 * c * l;
  Tensor full = Tensor::Empty({b, s, hc, d}, send.dtype(), send.device());
  for (int i = 0; i < c; ++i) {
    for (int a = 0; a < 2; ++a) {
      const int gc = ChunkLayout::GlobalChunk(c, i, a);
      MCC_RETURN_IF_ERROR(CopyBlock(recv, b, l * run, l * run,
                                    (i * 2 + a) * block, s * run, gc * l * run,
                                    &full));
    }
  }
  return full;
}

// The inverse: [b, 2CL, H / C, d] of head block `rank` -> this rank's two
// chunks of all heads, [b, L, H, d] each.
absl::StatusOr<ChunkPair> HeadsToSeq(const Group& g, const Tensor& full) {
  const int c = g.size;
  const int64_t b = full.size(0), s = full.size(1), hc = full.size(2),
                d = full.size(3);
  const int64_t l = s / (2 * c), h = hc * c, run = hc * d, block = b * l * run;
  Tensor send = Tensor::Empty({c * 2 * block}, full.dtype(), full.device());
  for (int i = 0; i < c; ++i) {
    for (int a = 0; a < 2; ++a) {
      const int gc = ChunkLayout::GlobalChunk(c, i, a);
      MCC_RETURN_IF_ERROR(CopyBlock(full, b, l * run, s * run, gc * l * run,
                                    l * run, (i * 2 + a) * block, &send));
    }
  }
  Tensor recv = Tensor::Empty(send.shape(), send.dtype(), send.device());
  MCC_RETURN_IF_ERROR(AllToAll(g, send, &recv));
  ChunkPair x;
  for (int a = 0; a < 2; ++a) {
    x[a] = Tensor::Empty({b, l, h, d}, full.dtype(), full.device());
    for (int j = 0; j < c; ++j) {
      MCC_RETURN_IF_ERROR(CopyBlock(recv, b * l, run, run, (j * 2 + a) * block,
                                    h * d, j * run, &x[a]));
    }
  }
  return x;
}

absl::Status CheckHeads(const char* op, const Group& g, const QkvChunks& in) {
  for (int a = 0; a < 2; ++a) {
    for (const Tensor* t : {&in.q[a], &in.k[a], &in.v[a]}) {
      if (!t->defined() || t->dim() != 4 || t->size(2) % g.size != 0 ||
          t->size(0) != in.q[0].size(0) || t->size(1) != in.q[0].size(1) ||
          t->size(3) != in.q[0].size(3)) {
        return absl::InvalidArgumentError(absl::StrCat(
            op, ": chunk ", t->Describe(),
            " must be [batch, chunk_length, heads, head_dim] like q ",
            in.q[0].Describe(),
            ", with heads divisible by the "
            "context-parallel size ",
            g.size, " (--cp-comm-type a2a)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status UlyssesAttentionForward(comm::ProcessGroup* group,
                                     const QkvChunks& in, float softmax_scale,
                                     ChunkPair* out, UlyssesRecord* record) {
  const Group g = GroupOf(group);
  MCC_RETURN_IF_ERROR(CheckHeads("UlyssesAttentionForward", g, in));
  MCC_ASSIGN_OR_RETURN(record->q, SeqToHeads(g, in.q));
  MCC_ASSIGN_OR_RETURN(record->k, SeqToHeads(g, in.k));
  MCC_ASSIGN_OR_RETURN(record->v, SeqToHeads(g, in.v));
  const Tensor& q = record->q;
  record->out = Tensor::Empty(q.shape(), q.dtype(), q.device());
  record->lse = Tensor::Empty({q.size(0), q.size(2), q.size(1)},
                              DType::kFloat32, q.device());
  ops::AttentionOptions options;
  options.softmax_scale = softmax_scale;
  // The gathered sequence is in global order: the first keys apply as they
  // are.
  record->first_key = in.first_key;
  options.first_key = in.first_key;
  MCC_RETURN_IF_ERROR(ops::FlashAttentionForward(
      q, record->k, record->v, options, &record->out, &record->lse));
  MCC_ASSIGN_OR_RETURN(*out, HeadsToSeq(g, record->out));
  return absl::OkStatus();
}

absl::Status UlyssesAttentionBackward(comm::ProcessGroup* group,
                                      const UlyssesRecord& record,
                                      const ChunkPair& dout,
                                      float softmax_scale, QkvChunks* grads) {
  const Group g = GroupOf(group);
  if (!record.q.defined() || !record.out.defined()) {
    return absl::FailedPreconditionError(
        "UlyssesAttentionBackward: no forward record");
  }
  MCC_ASSIGN_OR_RETURN(Tensor dout_full, SeqToHeads(g, dout));
  const Tensor& q = record.q;
  Tensor dq = Tensor::Empty(q.shape(), q.dtype(), q.device());
  Tensor dk = Tensor::Empty(record.k.shape(), q.dtype(), q.device());
  Tensor dv = Tensor::Empty(record.v.shape(), q.dtype(), q.device());
  ops::AttentionOptions options;
  options.softmax_scale = softmax_scale;
  options.first_key = record.first_key;
  MCC_RETURN_IF_ERROR(
      ops::FlashAttentionBackward(q, record.k, record.v, record.out, dout_full,
                                  record.lse, options, &dq, &dk, &dv));
  MCC_ASSIGN_OR_RETURN(grads->q, HeadsToSeq(g, dq));
  MCC_ASSIGN_OR_RETURN(grads->k, HeadsToSeq(g, dk));
  MCC_ASSIGN_OR_RETURN(grads->v, HeadsToSeq(g, dv));
  return absl::OkStatus();
}

}  // namespace context_parallel
}  // namespace mcc
