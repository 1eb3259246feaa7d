// Device code of the softmax merge of partial attention results (context
// parallelism's MergeAttentionPartial, parallel/context_parallel/
// softmax_merge.h), apart from its launcher (merge_attention.cu) so the host
// emulator (cuda_emulator.h) runs it in CI. The includer provides CUDA's
// thread indices, __syncwarp, expf, logf and fmaxf.
//
// One warp per row (b, t, h): the row's weights from the two logsumexps,
// then out = wa out + wc part_out over head_dim by the lanes, then lane 0
// writes the merged logsumexp (after every lane has read the old one).
#ifndef CORE_OPS_CUDA_MERGE_ATTENTION_KERNELS_CUH_
#define CORE_OPS_CUDA_MERGE_ATTENTION_KERNELS_CUH_

#include <cstdint>

namespace mcc {
namespace cuda_kernels {
namespace merge {

struct Params {
  const float* part_out = nullptr;  // [b, s, h, d]
  const float* part_lse = nullptr;  // [b, h, s]
  float* out = nullptr;             // [b, s, h, d], merged in place
  float* lse = nullptr;             // [b, h, s], merged in place
  int64_t b = 0, s = 0, h = 0, d = 0;
};

constexpr int kThreads = 256;

inline unsigned int GridFor(const Params& p) {
  int64_t blocks = (p.b * p.s * p.h + kThreads / 32 - 1) / (kThreads / 32);
  if (blocks > 65536) blocks = 65536;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned int>(blocks);
}

__global__ void __launch_bounds__(kThreads) MergeKernel(Params p) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (kThreads / 32);
  const int64_t rows = p.b * p.s * p.h;
  for (int64_t row = blockIdx.x * int64_t{kThreads / 32} + threadIdx.x / 32;
       row < rows; row += warps) {
    const int64_t hi = row % p.h, t = (row / p.h) % p.s, bi = row / (p.h * p.s);
    const int64_t li = (bi * p.h + hi) * p.s + t;
    const float a = p.lse[li], c = p.part_lse[li];
    const float m = fmaxf(a, c);
    // Neither part has seen a key: the row stays (0, -inf).
    if (m == -INFINITY) continue;
    const float merged = m + logf(expf(a - m) + expf(c - m));
    const float wa = expf(a - merged), wc = expf(c - merged);
    float* o = p.out + row * p.d;
    const float* po = p.part_out + row * p.d;
    for (int64_t x = lane; x < p.d; x += 32) o[x] = wa * o[x] + wc * po[x];
    __syncwarp();  // Every lane has read lse[li].
    if (lane == 0) p.lse[li] = merged;
  }
}

}  // namespace merge
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_MERGE_ATTENTION_KERNELS_CUH_
