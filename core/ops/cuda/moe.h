// Launchers of the mixture-of-experts CUDA kernels of //core/ops/cuda:kernels
// (the router, loss, expert-bias and permutation slots of
// core/ops/moe_router.h and core/ops/moe_permute.h). Conventions as in
// elementwise.h; the device code is moe_kernels.cuh. Every result is
// computed without atomics in a fixed order, so a call repeats its bits.
// Scratch buffers are the caller's (device memory, sizes as stated).
#ifndef CORE_OPS_CUDA_MOE_H_
#define CORE_OPS_CUDA_MOE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

struct MoeRouterArgs {
  int64_t tokens = 0, experts = 0, topk = 0;
  bool sigmoid = false;   // else softmax
  bool normalize = true;  // normalize_topk
  float scaling = 1.0f;
};

// scores [tokens, experts], indices int32 [tokens, topk] and weights
// [tokens, topk] from logits (fp32); bias [experts] or null.
cudaError_t MoeRouterForward(const MoeRouterArgs& a, const float* logits,
                             const float* bias, float* scores, int32_t* indices,
                             float* weights, cudaStream_t stream);
// dlogits [tokens, experts] overwritten.
cudaError_t MoeRouterBackward(const MoeRouterArgs& a, const float* scores,
                              const int32_t* indices, const float* dweights,
                              float* dlogits, cudaStream_t stream);

struct MoeBalanceArgs {
  int64_t tokens = 0, experts = 0, topk = 0, sequences = 1;
  // Context parallelism (ops::MoeSequenceTotals): the whole sequences'
  // counts int64 [sequences, experts] on the device and length; null / 0:
  // this rank's.
  const int64_t* total_counts = nullptr;
  int64_t length = 0;
  bool sigmoid = false;
  float coeff = 0.0f, grad_scale = 1.0f;
};
// Scratch: counts int64 [sequences * experts], psum float64 [sequences *
// experts], z fp32 [tokens] (sigmoid only; may be null otherwise).
cudaError_t MoeLoadBalancingLoss(const MoeBalanceArgs& a, const float* scores,
                                 const int32_t* indices, int64_t* counts,
                                 double* psum, float* z, float* loss,
                                 cudaStream_t stream);
// dlogits accumulated. Scratch: counts as above.
cudaError_t MoeLoadBalancingLossBackward(const MoeBalanceArgs& a,
                                         const float* scores,
                                         const int32_t* indices,
                                         int64_t* counts, float* dlogits,
                                         cudaStream_t stream);

// Scratch: terms float64 [tokens].
cudaError_t MoeZLoss(const float* logits, int64_t tokens, int64_t experts,
                     float coeff, double* terms, float* loss,
                     cudaStream_t stream);
// dlogits accumulated.
cudaError_t MoeZLossBackward(const float* logits, int64_t tokens,
                             int64_t experts, float coeff, float grad_scale,
                             float* dlogits, cudaStream_t stream);

cudaError_t MoeUpdateExpertBias(const int64_t* counts, int64_t experts,
                                float rate, float* bias, cudaStream_t stream);

// The stable counting sort of slots by expert (moe_permute.h). A slot whose
// index lies outside [0, experts) gets slot_to_row -1, and rows left
// without a slot get row_to_slot -1.
cudaError_t MoeSortTokens(const int32_t* indices, int64_t slots,
                          int64_t experts, int32_t* row_to_slot,
                          int32_t* slot_to_row, int64_t* counts,
                          cudaStream_t stream);

// permuted [tokens * k, h] from x [tokens, h] (bit copies); a row whose
// index is outside [0, tokens * k) is NaN.
cudaError_t MoePermute(const void* x, ElemType t, const int32_t* row_to_slot,
                       int64_t tokens, int64_t k, int64_t h, void* permuted,
                       cudaStream_t stream);
// y [tokens, h] = the weighted sum (weights fp32 [tokens, k] or null) of
// each token's k rows of expert_out [tokens * k, h]; an index outside the
// rows contributes NaN.
cudaError_t MoeUnpermute(const void* expert_out, ElemType t,
                         const int32_t* slot_to_row, const float* weights,
                         int64_t tokens, int64_t k, int64_t h, void* y,
                         cudaStream_t stream);
// dexpert_out [tokens * k, h] overwritten (rows no slot names are left as
// they were); dweights fp32 [tokens, k] when weights is given.
cudaError_t MoeUnpermuteBackward(const void* dy, const void* expert_out,
                                 ElemType t, const int32_t* slot_to_row,
                                 const float* weights, int64_t tokens,
                                 int64_t k, int64_t h, void* dexpert_out,
                                 float* dweights, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_MOE_H_
