// Launcher of the cached-attention (decode) CUDA kernel of
// //core/ops/cuda:kernels (the CachedAttention slot,
// core/ops/cached_attention.h). Conventions as in elementwise.h.
#ifndef CORE_OPS_CUDA_CACHED_ATTENTION_H_
#define CORE_OPS_CUDA_CACHED_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// The largest head_dim the kernel takes.
constexpr int64_t kCachedAttentionMaxHeadDim = 256;

// out [b, n, heads, d] (type qt, overwritten) = softmax(scale q k^T) v for
// queries q [b, n, heads, d] at positions position + i over the fp32 caches
// k, v [b, capacity, groups, d], query i seeing positions 0 .. position +
// i; head h reads group h / (heads / groups). fp32 arithmetic, the result
// rounded once; deterministic.
cudaError_t CachedAttention(const void* q, ElemType qt, const float* k,
                            const float* v, void* out, int64_t batch, int64_t n,
                            int64_t heads, int64_t groups, int64_t capacity,
                            int64_t head_dim, int64_t position, float scale,
                            cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_CACHED_ATTENTION_H_
