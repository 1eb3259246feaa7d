#include "core/ops/cuda/kernel_util.cuh"
#include "core/ops/cuda/paged_attention.h"

namespace mcc {
namespace cuda_kernels {
namespace paged {

__device__ __forceinline__ float* SharedFloats() {
  extern __shared__ float4 paged_shared[];
  return reinterpret_cast<float*>(paged_shared);
}

}  // namespace paged
}  // namespace cuda_kernels
}  // namespace mcc

#include "core/ops/cuda/paged_attention_kernels.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GridFor;
using internal::kThreads;

}  // namespace

cudaError_t PagedKvWrite(const float* k, const float* v, const int64_t* slots,
                         float* k_pool, float* v_pool, int64_t rows,
                         int64_t row_elems, cudaStream_t stream) {
  const int64_t n = rows * row_elems;
  if (n == 0) return cudaSuccess;
  paged::PagedKvWriteKernel<<<GridFor(n), kThreads, 0, stream>>>(
      k, v, slots, k_pool, v_pool, rows, row_elems);
  return cudaGetLastError();
}

cudaError_t PagedAttention(const float* q, const float* k_pool,
                           const float* v_pool, const int32_t* tables,
                           const int64_t* positions, float* out, int64_t rows,
                           int64_t heads, int64_t groups, int64_t head_dim,
                           int64_t block_size, int64_t max_blocks, float scale,
                           int64_t window_left, cudaStream_t stream) {
  if (rows * heads == 0 || head_dim == 0) return cudaSuccess;
  if (head_dim > kPagedAttentionMaxHeadDim) return cudaErrorInvalidValue;
  paged::Params p;
  p.q = q;
  p.k = k_pool;
  p.v = v_pool;
  p.tables = tables;
  p.positions = positions;
  p.out = out;
  p.rows = rows;
  p.heads = heads;
  p.groups = groups;
  p.d = head_dim;
  p.block_size = block_size;
  p.max_blocks = max_blocks;
  p.scale = scale;
  p.window_left = window_left;
  paged::PagedAttentionKernel<<<static_cast<unsigned int>(rows * heads),
                                paged::kThreads, paged::kSmemBytes, stream>>>(
      p);
  return cudaGetLastError();
}

cudaError_t RotaryAtPositions(const RotaryArgs& args, const int64_t* positions,
                              const void* x, ElemType xt, void* y, ElemType yt,
                              cudaStream_t stream) {
  const int64_t n = args.batch * args.heads * args.head_dim;
  if (n == 0) return cudaSuccess;
  static_assert(paged::RotaryParams::kMaxHalf == RotaryArgs::kMaxHalf,
                "the two rotary kernels take the same rotary_dim");
  paged::RotaryParams p;
  for (int i = 0; i < RotaryArgs::kMaxHalf; ++i)
    p.inv_freq[i] = args.inv_freq[i];
  p.positions = positions;
  p.x = x;
  p.xt = xt;
  p.y = y;
  p.yt = yt;
  p.rows = args.batch;
  p.heads = args.heads;
  p.d = args.head_dim;
  p.rotary_dim = args.rotary_dim;
  paged::RotaryAtPositionsKernel<<<GridFor(n), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
