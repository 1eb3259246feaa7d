// Launchers for the embedding CUDA kernels of //core/ops/cuda:kernels (the
// EmbeddingLookup and EmbeddingBackward slots, core/ops/embedding.h).
// Conventions as in elementwise.h.
#ifndef CORE_OPS_CUDA_EMBEDDING_H_
#define CORE_OPS_CUDA_EMBEDDING_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// out[t, :] = table[ids[t] - vocab_start, :] for `tokens` ids (int32 or
// int64, it) over a [vocab, hidden] table, converted to out's type. An id
// outside the shard gives a zero row with mask_outside; without it the
// CPU's error cannot be reported without synchronising, so the row is NaN
// (loud in the loss).
cudaError_t EmbeddingLookup(const void* ids, ElemType it, int64_t tokens,
                            const void* table, ElemType tt, int64_t vocab,
                            int64_t hidden, int64_t vocab_start,
                            bool mask_outside, void* out, ElemType ot,
                            cudaStream_t stream);

// dtable[ids[t] - vocab_start, :] += dout[t, :] (dtable fp32), each element
// summed in token order in fp32 as the CPU kernel does (the same bits); ids
// outside the shard add nothing. One thread per column walks the tokens in
// order: deterministic, but latency-bound for long sequences (a sort of
// the ids into per-row segments is the faster follow-up).
cudaError_t EmbeddingBackward(const void* ids, ElemType it, int64_t tokens,
                              const void* dout, ElemType dt, int64_t vocab,
                              int64_t hidden, int64_t vocab_start,
                              float* dtable, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_EMBEDDING_H_
