// The per-warp online softmax and the warp merge that the decode-attention
// kernels share (cached_attention_kernels.cuh over a contiguous cache,
// paged_attention_kernels.cuh over a block table): one block per query row
// and head, each warp over every kWarps-th key, lane x holding elements x,
// x + 32, ... of head_dim. The includer provides CUDA's __shfl_xor_sync,
// expf and fmaf (or the host emulator's, cuda_emulator.h).
#ifndef CORE_OPS_CUDA_DECODE_ATTENTION_WARP_CUH_
#define CORE_OPS_CUDA_DECODE_ATTENTION_WARP_CUH_

#ifndef MCC_FA_UNROLL
#define MCC_FA_UNROLL _Pragma("unroll")
#endif

namespace mcc {
namespace cuda_kernels {
namespace decode {

// One key of a warp's online softmax: the score of query qv against the key
// at k (d floats) with the lanes' products summed across the warp, then
// the running max m, sum l and output acc updated with the value at v.
template <int kPerLane>
__device__ __forceinline__ void AddKey(const float (&qv)[kPerLane],
                                       const float* k, const float* v, int lane,
                                       int d, float scale, float* m, float* l,
                                       float (&acc)[kPerLane]) {
  float dot = 0.0f;
  MCC_FA_UNROLL
  for (int i = 0; i < kPerLane; ++i) {
    const int x = lane + 32 * i;
    if (x < d) dot = fmaf(qv[i], k[x], dot);
  }
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  const float score = dot * scale;
  const float mnew = fmaxf(*m, score);
  const float alpha = expf(*m - mnew);  // 0 for the first key (m = -inf)
  const float pj = expf(score - mnew);
  *l = *l * alpha + pj;
  MCC_FA_UNROLL
  for (int i = 0; i < kPerLane; ++i) {
    const int x = lane + 32 * i;
    const float vx = x < d ? v[x] : 0.0f;
    acc[i] = fmaf(pj, vx, acc[i] * alpha);
  }
  *m = mnew;
}

// Shared memory floats the merge needs: per warp a max, a sum and a row.
template <int kWarps, int kPerLane>
constexpr int SharedFloatsNeeded() {
  return kWarps * (2 + 32 * kPerLane);
}

// Before __syncthreads: this warp's max, sum and output into `sm`.
template <int kWarps, int kPerLane>
__device__ __forceinline__ void StorePartial(float* sm, int warp, int lane,
                                             float m, float l,
                                             const float (&acc)[kPerLane]) {
  float* sm_o = sm + 2 * kWarps;
  if (lane == 0) {
    sm[warp] = m;
    sm[kWarps + warp] = l;
  }
  MCC_FA_UNROLL
  for (int i = 0; i < kPerLane; ++i) {
    sm_o[(warp * kPerLane + i) * 32 + lane] = acc[i];
  }
}

// After __syncthreads, on warp 0: the warps' partials merged in warp order
// (deterministic), each of this lane's output elements x < d handed to
// store(x, value).
template <int kWarps, int kPerLane, typename Store>
__device__ __forceinline__ void MergePartials(const float* sm, int lane, int d,
                                              Store store) {
  const float* sm_m = sm;
  const float* sm_l = sm + kWarps;
  const float* sm_o = sm + 2 * kWarps;
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
    store(x, o / sum);
  }
}

}  // namespace decode
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_DECODE_ATTENTION_WARP_CUH_
