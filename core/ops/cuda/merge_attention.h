// Launcher of the CUDA kernel for context parallelism's softmax merge
// (MergeAttentionPartial, parallel/context_parallel/softmax_merge.h) in
// //core/ops/cuda:kernels. Conventions as in elementwise.h.
//
// The kernel lives here with the other CUDA kernels; its slot lives in
// //parallel/context_parallel, above core, so the registration belongs to a
// library there (core must not depend on parallel).
#ifndef CORE_OPS_CUDA_MERGE_ATTENTION_H_
#define CORE_OPS_CUDA_MERGE_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace mcc {
namespace cuda_kernels {

// (out, lse) = merge of (out, lse) and (part_out, part_lse) in place, all
// fp32: out, part_out [b, s, heads, d], lse, part_lse [b, heads, s]; per
// row l = log(exp(l1) + exp(l2)) from the larger of the two, o = exp(l1 -
// l) o1 + exp(l2 - l) o2; rows where both are -inf are left alone.
cudaError_t MergeAttentionPartial(const float* part_out, const float* part_lse,
                                  float* out, float* lse, int64_t batch,
                                  int64_t seq, int64_t heads, int64_t head_dim,
                                  cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_MERGE_ATTENTION_H_
