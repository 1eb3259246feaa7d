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

#include "core/ops/cuda/decode_attention_warp.cuh"
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
constexpr size_t kSmemBytes =
    decode::SharedFloatsNeeded<kWarps, kPerLane>() * sizeof(float);

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
    decode::AddKey(qv, p.k + base, p.v + base, lane, d, p.scale, &m, &l, acc);
  }
  float* sm = SharedFloats();
  decode::StorePartial<kWarps, kPerLane>(sm, warp, lane, m, l, acc);
  __syncthreads();
  if (warp != 0) return;
  decode::MergePartials<kWarps, kPerLane>(sm, lane, d, [&](int x, float o) {
    internal::StoreAs(p.out, p.qt, row * p.d + x, o);
  });
}

}  // namespace cached
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_CACHED_ATTENTION_KERNELS_CUH_
