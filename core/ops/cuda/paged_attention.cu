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

using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;
using internal::kThreads;
using internal::LoadAs;
using internal::StoreAs;

__global__ void PagedKvWriteKernel(const float* k, const float* v,
                                   const int64_t* slots, float* k_pool,
                                   float* v_pool, int64_t rows,
                                   int64_t row_elems) {
  const int64_t n = rows * row_elems;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t r = i / row_elems, e = i % row_elems;
    const int64_t dst = slots[r] * row_elems + e;
    k_pool[dst] = k[i];
    v_pool[dst] = v[i];
  }
}

// One thread per (row, head, j < half): rotates the pair (j, j + half);
// dims past rotary_dim are copied by their own threads unless in place.
__global__ void RotaryAtPositionsKernel(RotaryArgs a, const int64_t* positions,
                                        const void* x, ElemType xt, void* y,
                                        ElemType yt, bool in_place) {
  const int64_t half = a.rotary_dim / 2, d = a.head_dim;
  const int64_t n = a.batch * a.heads * d;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t j = i % d;
    if (j >= a.rotary_dim) {
      if (!in_place) StoreAs(y, yt, i, LoadAs(x, xt, i));
      continue;
    }
    if (j >= half) continue;
    const int64_t r = i / (a.heads * d);
    const double theta = static_cast<double>(positions[r]) * a.inv_freq[j];
    const float c = static_cast<float>(cos(theta));
    const float s = static_cast<float>(sin(theta));
    const float x1 = LoadAs(x, xt, i), x2 = LoadAs(x, xt, i + half);
    StoreAs(y, yt, i, x1 * c - x2 * s);
    StoreAs(y, yt, i + half, x2 * c + x1 * s);
  }
}

}  // namespace

cudaError_t PagedKvWrite(const float* k, const float* v, const int64_t* slots,
                         float* k_pool, float* v_pool, int64_t rows,
                         int64_t row_elems, cudaStream_t stream) {
  const int64_t n = rows * row_elems;
  if (n == 0) return cudaSuccess;
  PagedKvWriteKernel<<<GridFor(n), kThreads, 0, stream>>>(
      k, v, slots, k_pool, v_pool, rows, row_elems);
  return cudaGetLastError();
}

cudaError_t PagedAttention(const float* q, const float* k_pool,
                           const float* v_pool, const int32_t* tables,
                           const int64_t* positions, float* out, int64_t rows,
                           int64_t heads, int64_t groups, int64_t head_dim,
                           int64_t block_size, int64_t max_blocks, float scale,
                           cudaStream_t stream) {
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
  RotaryAtPositionsKernel<<<GridFor(n), kThreads, 0, stream>>>(
      args, positions, x, xt, y, yt, x == y);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
