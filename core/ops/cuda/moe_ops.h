// CUDA kernels of the mixture-of-experts slots of core/ops/moe_router.h
// (MoeRouterForward/Backward, MoeLoadBalancingLoss(Backward),
// MoeZLoss(Backward), MoeUpdateExpertBias) and core/ops/moe_permute.h
// (MoeSortTokens, MoePermute, MoeUnpermute, MoeUnpermuteBackward), with the
// CPU kernels' contract, through the launchers of moe.h. No atomics: each
// call repeats its bits (same order, same sums) on every run.
//
// Index values are data the host cannot read without synchronising, so the
// CUDA kernels do not refuse bad ones as the CPU kernels do: an expert index
// outside [0, experts) is not counted and gets no row, and a row or slot
// index outside the permuted rows gives NaN (as the embedding kernels do for
// a bad id). Router indices are always in range.
//
// Linking //core/ops/cuda:registrations registers them; call the ops, not
// these.
#ifndef CORE_OPS_CUDA_MOE_OPS_H_
#define CORE_OPS_CUDA_MOE_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/moe_router.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {
namespace cuda {

absl::Status MoeRouterForwardCuda(const Tensor& logits, const Tensor* bias,
                                  const MoeRouterOptions& options,
                                  Tensor* scores, Tensor* indices,
                                  Tensor* weights);
absl::Status MoeRouterBackwardCuda(const Tensor& scores, const Tensor& indices,
                                   const Tensor& dweights,
                                   const MoeRouterOptions& options,
                                   Tensor* dlogits);
absl::Status MoeLoadBalancingLossCuda(const Tensor& scores,
                                      const Tensor& indices, MoeScoreFunction f,
                                      int64_t sequences, float coeff,
                                      Tensor* loss,
                                      const MoeSequenceTotals& totals);
absl::Status MoeLoadBalancingLossBackwardCuda(const Tensor& scores,
                                              const Tensor& indices,
                                              MoeScoreFunction f,
                                              int64_t sequences, float coeff,
                                              float grad_scale, Tensor* dlogits,
                                              const MoeSequenceTotals& totals);
absl::Status MoeZLossCuda(const Tensor& logits, float coeff, Tensor* loss);
absl::Status MoeZLossBackwardCuda(const Tensor& logits, float coeff,
                                  float grad_scale, Tensor* dlogits);
absl::Status MoeUpdateExpertBiasCuda(const Tensor& tokens_per_expert,
                                     float rate, Tensor* expert_bias);
absl::Status MoeSortTokensCuda(const Tensor& indices, int64_t num_experts,
                               Tensor* row_to_slot, Tensor* slot_to_row,
                               Tensor* tokens_per_expert);
absl::Status MoePermuteCuda(const Tensor& x, const Tensor& row_to_slot,
                            Tensor* permuted);
absl::Status MoeUnpermuteCuda(const Tensor& expert_out,
                              const Tensor& slot_to_row, const Tensor* weights,
                              Tensor* y);
absl::Status MoeUnpermuteBackwardCuda(const Tensor& dy,
                                      const Tensor& expert_out,
                                      const Tensor& slot_to_row,
                                      const Tensor* weights,
                                      Tensor* dexpert_out, Tensor* dweights);

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_MOE_OPS_H_
