#include "core/ops/cuda/merge_attention.h"
#include "core/ops/cuda/merge_attention_kernels.cuh"

namespace mcc {
namespace cuda_kernels {

cudaError_t MergeAttentionPartial(const float* part_out, const float* part_lse,
                                  float* out, float* lse, int64_t batch,
                                  int64_t seq, int64_t heads, int64_t head_dim,
                                  cudaStream_t stream) {
  if (batch * seq * heads == 0) return cudaSuccess;
  merge::Params p;
  p.part_out = part_out;
  p.part_lse = part_lse;
  p.out = out;
  p.lse = lse;
  p.b = batch;
  p.s = seq;
  p.h = heads;
  p.d = head_dim;
  merge::MergeKernel<<<merge::GridFor(p), merge::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
