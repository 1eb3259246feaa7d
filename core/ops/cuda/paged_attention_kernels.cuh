// Device code of the paged decoding CUDA kernels (attention, KV write,
// rotary at per-row positions), apart from their launchers
// (paged_attention.cu) so that the host emulator (cuda_emulator.h) runs them
// in CI. The includer provides paged::SharedFloats() (the block's dynamic
// shared memory), internal::LoadAs / StoreAs (kernel_util.cuh) and CUDA's
// thread indices, __syncthreads, __shfl_xor_sync, expf, cos and sin.
//
// The cached-attention kernel's scheme (cached_attention_kernels.cuh) over
// a paged pool: one block of kThreads threads per (row, head); each warp
// takes the keys warp, warp + kWarps, ... of the row's sequence, finding
// each key's slot through the row's block table on the device, computes the
// score with its lanes over head_dim and keeps an online softmax; the
// warps' partial results are merged in shared memory in warp order. A row's
// result depends only on its own query, table and keys (batch-invariant).
#ifndef CORE_OPS_CUDA_PAGED_ATTENTION_KERNELS_CUH_
#define CORE_OPS_CUDA_PAGED_ATTENTION_KERNELS_CUH_

#include <cstddef>
#include <cstdint>

#include "core/ops/cuda/decode_attention_warp.cuh"
#include "core/ops/cuda/elem_type.h"
#include "core/ops/sliding_window.h"

#ifndef MCC_FA_UNROLL
#define MCC_FA_UNROLL _Pragma("unroll")
#endif

namespace mcc {
namespace cuda_kernels {
namespace paged {

struct Params {
  const float* q = nullptr;  // [rows, heads, d]
  const float* k = nullptr;  // [blocks, block_size, groups, d]
  const float* v = nullptr;
  const int32_t* tables = nullptr;     // [rows, max_blocks]
  const int64_t* positions = nullptr;  // [rows]
  float* out = nullptr;                // [rows, heads, d]
  int64_t rows = 0, heads = 0, groups = 0, d = 0;
  int64_t block_size = 0, max_blocks = 0;
  float scale = 1.0f;
  int64_t window_left = -1;  // >= 0: keys p - window_left .. p only.
};

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = 8;  // head_dim up to 32 * kPerLane
constexpr int64_t kMaxHeadDim = 32 * kPerLane;
// Per warp: max, sum and a head_dim row.
constexpr size_t kSmemBytes =
    decode::SharedFloatsNeeded<kWarps, kPerLane>() * sizeof(float);

__global__ void __launch_bounds__(kThreads) PagedAttentionKernel(Params p) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t t = blockIdx.x;  // r * heads + h
  const int64_t h = t % p.heads, r = t / p.heads;
  const int64_t g = h / (p.heads / p.groups);
  const int64_t keys = p.positions[r] + 1;
  const int64_t first =
      ::mcc::ops::SlidingWindowFirstKey(keys - 1, p.window_left);
  const int32_t* table = p.tables + r * p.max_blocks;
  const int d = static_cast<int>(p.d);
  float qv[kPerLane], acc[kPerLane];
  MCC_FA_UNROLL
  for (int i = 0; i < kPerLane; ++i) {
    const int x = lane + 32 * i;
    qv[i] = x < d ? p.q[t * p.d + x] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = first + warp; j < keys; j += kWarps) {
    const int64_t slot =
        static_cast<int64_t>(table[j / p.block_size]) * p.block_size +
        j % p.block_size;
    const int64_t base = (slot * p.groups + g) * p.d;
    decode::AddKey(qv, p.k + base, p.v + base, lane, d, p.scale, &m, &l, acc);
  }
  float* sm = SharedFloats();
  decode::StorePartial<kWarps, kPerLane>(sm, warp, lane, m, l, acc);
  __syncthreads();
  if (warp != 0) return;
  decode::MergePartials<kWarps, kPerLane>(
      sm, lane, d, [&](int x, float o) { p.out[t * p.d + x] = o; });
}

// Row r of k and v (fp32 [rows, row_elems]) to row slots[r] of the pools;
// a grid-stride loop over the elements.
__global__ void PagedKvWriteKernel(const float* k, const float* v,
                                   const int64_t* slots, float* k_pool,
                                   float* v_pool, int64_t rows,
                                   int64_t row_elems) {
  const int64_t n = rows * row_elems;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += stride) {
    const int64_t dst = slots[i / row_elems] * row_elems + i % row_elems;
    k_pool[dst] = k[i];
    v_pool[dst] = v[i];
  }
}

struct RotaryParams {
  static constexpr int kMaxHalf = 128;  // rotary_dim up to 256
  double inv_freq[kMaxHalf] = {};       // RotaryInverseFrequencies
  const int64_t* positions = nullptr;   // [rows]
  const void* x = nullptr;              // [rows, heads, d], type xt
  ElemType xt = ElemType::kF32;
  void* y = nullptr;  // like x, type yt; may be x
  ElemType yt = ElemType::kF32;
  int64_t rows = 0, heads = 0, d = 0, rotary_dim = 0;
};

// One thread per (row, head, j < half) rotates the pair (j, j + half) by
// positions[row] * inv_freq[j] (float64 angle, fp32 cos and sin); dims past
// rotary_dim are copied by their own threads unless in place.
__global__ void RotaryAtPositionsKernel(RotaryParams a) {
  const int64_t half = a.rotary_dim / 2, d = a.d;
  const int64_t n = a.rows * a.heads * d;
  const bool in_place = a.x == a.y;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += stride) {
    const int64_t j = i % d;
    if (j >= a.rotary_dim) {
      if (!in_place)
        internal::StoreAs(a.y, a.yt, i, internal::LoadAs(a.x, a.xt, i));
      continue;
    }
    if (j >= half) continue;
    const int64_t r = i / (a.heads * d);
    const double theta = static_cast<double>(a.positions[r]) * a.inv_freq[j];
    const float c = static_cast<float>(cos(theta));
    const float s = static_cast<float>(sin(theta));
    const float x1 = internal::LoadAs(a.x, a.xt, i);
    const float x2 = internal::LoadAs(a.x, a.xt, i + half);
    internal::StoreAs(a.y, a.yt, i, x1 * c - x2 * s);
    internal::StoreAs(a.y, a.yt, i + half, x2 * c + x1 * s);
  }
}

}  // namespace paged
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_PAGED_ATTENTION_KERNELS_CUH_
