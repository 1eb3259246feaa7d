// Device code of the paged-attention (decode) CUDA kernel, apart from its
// launcher (paged_attention.cu) so that the host emulator (cuda_emulator.h)
// runs it in CI. The includer provides paged::SharedFloats() (the block's
// dynamic shared memory) and CUDA's thread indices, __syncthreads,
// __shfl_xor_sync and expf.
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
};

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = 8;  // head_dim up to 32 * kPerLane
constexpr int64_t kMaxHeadDim = 32 * kPerLane;
// Per warp: max, sum and a head_dim row.
constexpr size_t kSmemBytes = kWarps * (2 + 32 * kPerLane) * sizeof(float);

__global__ void __launch_bounds__(kThreads) PagedAttentionKernel(Params p) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t t = blockIdx.x;  // r * heads + h
  const int64_t h = t % p.heads, r = t / p.heads;
  const int64_t g = h / (p.heads / p.groups);
  const int64_t keys = p.positions[r] + 1;
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
  for (int64_t j = warp; j < keys; j += kWarps) {
    const int64_t slot =
        static_cast<int64_t>(table[j / p.block_size]) * p.block_size +
        j % p.block_size;
    const int64_t base = (slot * p.groups + g) * p.d;
    float dot = 0.0f;
    MCC_FA_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      const int x = lane + 32 * i;
      if (x < d) dot = fmaf(qv[i], p.k[base + x], dot);
    }
    for (int o = 16; o > 0; o >>= 1)
      dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float score = dot * p.scale;
    const float mnew = fmaxf(m, score);
    const float alpha = expf(m - mnew);  // 0 for the first key (m = -inf)
    const float pj = expf(score - mnew);
    l = l * alpha + pj;
    MCC_FA_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      const int x = lane + 32 * i;
      const float vx = x < d ? p.v[base + x] : 0.0f;
      acc[i] = fmaf(pj, vx, acc[i] * alpha);
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
  for (int i = 0; i < kPerLane; ++i) {
    sm_o[(warp * kPerLane + i) * 32 + lane] = acc[i];
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
  for (int i = 0; i < kPerLane; ++i) {
    const int x = lane + 32 * i;
    if (x >= d) continue;
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      o = fmaf(sm_o[(w * kPerLane + i) * 32 + lane], wt[w], o);
    }
    p.out[t * p.d + x] = o / sum;
  }
}

}  // namespace paged
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_PAGED_ATTENTION_KERNELS_CUH_
