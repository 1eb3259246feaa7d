// Device code of the cached-attention (decode) CUDA kernel, apart from its
// launcher (cached_attention.cu) so that the host emulator
// (cuda_emulator.h) runs it in CI. The includer provides internal::LoadAs /
// internal::StoreAs (kernel_util.cuh), cached::SharedFloats() (the block's
// dynamic shared memory) and CUDA's thread indices, __syncthreads,
// __shfl_xor_sync and expf.
//
// One block of kThreads threads per query row (b, i, h): each warp takes
// the keys warp, warp + kWarps, ... of the row's kv group, computes each
// score with its lanes over head_dim (lane x holds q[x], q[x + 32], ...)
// and keeps an online softmax (max, sum, output); the warps' partial
// results are merged in shared memory in warp order (deterministic), then
// the row is written rounded once.
#ifndef CORE_OPS_CUDA_CACHED_ATTENTION_KERNELS_CUH_
#define CORE_OPS_CUDA_CACHED_ATTENTION_KERNELS_CUH_

#include <cstddef>
#include <cstdint>

#include "core/ops/cuda/elem_type.h"

#ifndef MCC_FA_UNROLL
#define MCC_FA_UNROLL _Pragma("unroll")
#endif

namespace mcc {
namespace cuda_kernels {
namespace cached {

struct Params {
  const void* q = nullptr;  // [b, n, heads, d]
  ElemType qt = ElemType::kF32;
  const float* k = nullptr;  // [b, capacity, groups, d]
  const float* v = nullptr;
  void* out = nullptr;  // like q, type qt
  int64_t b = 0, n = 0, heads = 0, groups = 0, capacity = 0, d = 0;
  int64_t position = 0;
  float scale = 1.0f;
};

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = 8;  // head_dim up to 32 * kPerLane
constexpr int64_t kMaxHeadDim = 32 * kPerLane;
// Per warp: max, sum and a head_dim row.
constexpr size_t kSmemBytes = kWarps * (2 + 32 * kPerLane) * sizeof(float);

__global__ void __launch_bounds__(kThreads) CachedAttentionKernel(Params p) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = blockIdx.x;  // (bi * n + i) * heads + h
  const int64_t h = row % p.heads, i = (row / p.heads) % p.n,
                bi = row / (p.heads * p.n);
  const int64_t g = h / (p.heads / p.groups);
  const int64_t keys = p.position + i + 1;
  const int d = static_cast<int>(p.d);
  float qv[kPerLane], acc[kPerLane];
  MCC_FA_UNROLL
  for (int t = 0; t < kPerLane; ++t) {
    const int x = lane + 32 * t;
    qv[t] = x < d ? internal::LoadAs(p.q, p.qt, row * p.d + x) : 0.0f;
    acc[t] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < keys; j += kWarps) {
    const int64_t base = ((bi * p.capacity + j) * p.groups + g) * p.d;
    float dot = 0.0f;
    MCC_FA_UNROLL
    for (int t = 0; t < kPerLane; ++t) {
      const int x = lane + 32 * t;
      if (x < d) dot = fmaf(qv[t], p.k[base + x], dot);
    }
    for (int o = 16; o > 0; o >>= 1)
      dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float score = dot * p.scale;
    const float mnew = fmaxf(m, score);
    const float alpha = expf(m - mnew);  // 0 for the first key (m = -inf)
    const float pj = expf(score - mnew);
    l = l * alpha + pj;
    MCC_FA_UNROLL
    for (int t = 0; t < kPerLane; ++t) {
      const int x = lane + 32 * t;
      const float vx = x < d ? p.v[base + x] : 0.0f;
      acc[t] = fmaf(pj, vx, acc[t] * alpha);
    }
    m = mnew;
  }
  float* sm = SharedFloats();
  float* sm_m = sm;
  float* sm_l = sm_m + kWarps;
  float* sm_o = sm_l + kWarps;
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
  MCC_FA_UNROLL
  for (int t = 0; t < kPerLane; ++t) {
    sm_o[(warp * kPerLane + t) * 32 + lane] = acc[t];
  }
  __syncthreads();
  if (warp != 0) return;
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w]);
  float sum = 0.0f, wt[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    // A warp that saw no key has m = -inf and weight 0.
    wt[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - mx);
    sum += sm_l[w] * wt[w];
  }
  MCC_FA_UNROLL
  for (int t = 0; t < kPerLane; ++t) {
    const int x = lane + 32 * t;
    if (x >= d) continue;
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      o = fmaf(sm_o[(w * kPerLane + t) * 32 + lane], wt[w], o);
    }
    internal::StoreAs(p.out, p.qt, row * p.d + x, o / sum);
  }
}

}  // namespace cached
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_CACHED_ATTENTION_KERNELS_CUH_
