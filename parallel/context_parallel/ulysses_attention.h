#ifndef PARALLEL_CONTEXT_PARALLEL_ULYSSES_ATTENTION_H_
#define PARALLEL_CONTEXT_PARALLEL_ULYSSES_ATTENTION_H_

// Causal self-attention over a sequence split across the context-parallel
// group by all-to-all over heads (--cp-comm-type a2a, DeepSpeed-Ulysses):
// an all-to-all turns each rank's two sequence chunks of every head
// (chunk_layout.h) into the whole sequence of heads / C heads, the serial
// flash kernel runs on it, and another all-to-all brings the output back
// to the chunks. The backward does the same with the gradients. Needs the
// heads and the key/value heads (of this tensor-parallel rank) to divide by
// C: query head h still reads kv head h / (heads / kv heads).
//
// Shapes and dtypes as ring_attention.h. Collective over `group` (every
// rank, same shapes, same order); null or size 1 runs alone. On error the
// outputs are unspecified and the group is unusable. Thread-compatible.

#include "absl/status/status.h"
#include "core/comm/process_group.h"
#include "core/tensor.h"
#include "parallel/context_parallel/ring_attention.h"

namespace mcc {
namespace context_parallel {

// What the backward needs: the whole sequence of this rank's heads / C
// heads, [b, S, heads / C, d] (lse: fp32 [b, heads / C, S]).
struct UlyssesRecord {
  Tensor q, k, v, out, lse;
  Tensor first_key;  // QkvChunks::first_key: the whole sequence's, as is.
};

absl::Status UlyssesAttentionForward(comm::ProcessGroup* group,
                                     const QkvChunks& in, float softmax_scale,
                                     ChunkPair* out, UlyssesRecord* record);

absl::Status UlyssesAttentionBackward(comm::ProcessGroup* group,
                                      const UlyssesRecord& record,
                                      const ChunkPair& dout,
                                      float softmax_scale, QkvChunks* grads);

}  // namespace context_parallel
}  // namespace mcc

#endif  // PARALLEL_CONTEXT_PARALLEL_ULYSSES_ATTENTION_H_
