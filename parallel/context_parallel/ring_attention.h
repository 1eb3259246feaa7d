#ifndef PARALLEL_CONTEXT_PARALLEL_RING_ATTENTION_H_
#define PARALLEL_CONTEXT_PARALLEL_RING_ATTENTION_H_

// Causal self-attention over a sequence split across the context-parallel
// group (--cp-comm-type p2p), as Megatron's ring attention.
//
// Each rank holds two chunks of the sequence (chunk_layout.h): its queries,
// keys and values as separate [b, L, heads, d] tensors per local chunk
// (L = S / 2C). The key/value blocks travel once around the ring (rank r
// sends to r + 1 and receives from r - 1), the next block's transfer posted
// before the current block's attention runs, so communication overlaps
// computation. Each query chunk attends to a received key chunk fully when
// that chunk lies before it in the sequence, causally when it is the same
// chunk, and not at all when it lies after; the partial results merge with
// the online-softmax statistics (softmax_merge.h), accumulated in fp32.
//
// The backward recomputes each block's probabilities from the saved global
// logsumexp (core/ops/attention.h's backward kernel, given the final output
// and lse), keeps dq at home and sends the key/value gradients around the
// ring with their block, so after C steps each rank gets the dk, dv of its
// own chunks summed over every rank's queries.
//
// Dtypes: q, k, v fp32 or bf16/fp16 (one dtype); outputs and gradients in
// that dtype; lse fp32 [b, heads, L]. GQA as the serial kernel (kv heads
// divide heads). No attention dropout.
//
// Collective over `group` (null or size 1: this rank alone, chunks 0 and 1
// of one sequence): every rank calls Forward (and Backward) the same number
// of times in the same order with equal shapes. Transfers use tags kKvTag
// and kGradTag of the group. On error (a failed transfer times out, never
// hangs) outputs are unspecified and the group is unusable. Thread-compatible.

#include <array>

#include "absl/status/status.h"
#include "core/comm/process_group.h"
#include "core/tensor.h"

namespace mcc {
namespace context_parallel {

// One rank's two local chunks of something: [0] the early chunk, [1] the
// late one (chunks r and 2C - 1 - r).
using ChunkPair = std::array<Tensor, 2>;

struct QkvChunks {
  ChunkPair q, k, v;  // [b, L, heads, d], [b, L, kv heads, d] x 2
  // Packed documents / sliding window: int32 [b, S] on the host, indexed by
  // global position, the first global key each query sees
  // (ops::AttentionOptions::first_key of the whole sequence); undefined:
  // causal only. Each ring step passes the query chunk's rows shifted into
  // the key chunk's coordinates, and skips a key chunk wholly before every
  // query's first key. Forward and backward must get the same.
  Tensor first_key;
};

// Time spent in the last call, for benchmarks: in attention kernels, and
// waiting for transfers that computation did not hide.
struct RingTimes {
  double compute_seconds = 0;
  double wait_seconds = 0;
};

inline constexpr uint32_t kKvTag = 0x43500001;
inline constexpr uint32_t kGradTag = 0x43500002;

// out: allocated here in q's dtype; lse: fp32 [b, heads, L]. softmax_scale
// 0 means 1 / sqrt(d).
absl::Status RingAttentionForward(comm::ProcessGroup* group,
                                  const QkvChunks& in, float softmax_scale,
                                  ChunkPair* out, ChunkPair* lse,
                                  RingTimes* times = nullptr);

// grads: allocated here (dq, dk, dv in q's dtype). out, lse: Forward's.
absl::Status RingAttentionBackward(comm::ProcessGroup* group,
                                   const QkvChunks& in, const ChunkPair& out,
                                   const ChunkPair& dout, const ChunkPair& lse,
                                   float softmax_scale, QkvChunks* grads,
                                   RingTimes* times = nullptr);

}  // namespace context_parallel
}  // namespace mcc

#endif  // PARALLEL_CONTEXT_PARALLEL_RING_ATTENTION_H_
