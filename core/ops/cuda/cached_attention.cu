#include "core/ops/cuda/cached_attention.h"
#include "core/ops/cuda/kernel_util.cuh"

namespace mcc {
namespace cuda_kernels {
namespace cached {

__device__ __forceinline__ float* SharedFloats() {
  extern __shared__ float4 cached_shared[];
  return reinterpret_cast<float*>(cached_shared);
}

}  // namespace cached
}  // namespace cuda_kernels
}  // namespace mcc

#include "core/ops/cuda/cached_attention_kernels.cuh"

namespace mcc {
namespace cuda_kernels {

cudaError_t CachedAttention(const void* q, ElemType qt, const float* k,
                            const float* v, void* out, int64_t batch, int64_t n,
                            int64_t heads, int64_t groups, int64_t capacity,
                            int64_t head_dim, int64_t position, float scale,
                            cudaStream_t stream) {
  const int64_t rows = batch * n * heads;
  if (rows == 0 || head_dim == 0) return cudaSuccess;
  if (head_dim > kCachedAttentionMaxHeadDim) return cudaErrorInvalidValue;
  cached::Params p;
  p.q = q;
  p.qt = qt;
  p.k = k;
  p.v = v;
  p.out = out;
  p.b = batch;
  p.n = n;
  p.heads = heads;
  p.groups = groups;
  p.capacity = capacity;
  p.d = head_dim;
  p.position = position;
  p.scale = scale;
  cached::
      CachedAttentionKernel<<<static_cast<unsigned int>(rows), cached::kThreads,
                              cached::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
