#ifndef CORE_OPS_MOE_ROUTER_H_
#define CORE_OPS_MOE_ROUTER_H_

// The mixture-of-experts router after its projection (logits = x W_r, an
// ordinary fp32 Gemm), in fp32 as Megatron's --moe-router-dtype fp32:
//
//   logits  [tokens, E]  fp32
//   scores  [tokens, E]  fp32: softmax(logits) or sigmoid(logits) per token
//   indices [tokens, k]  int32: the k experts of largest scores + bias
//                        (bias, DeepSeek-V3's aux-loss-free balancing, only
//                        chooses; it never enters a weight), in descending
//                        order of that value; equal values: the lower expert
//                        index first (and chosen), so the choice is
//                        deterministic
//   weights [tokens, k]  fp32 combine weights: scaling * s_i / sum_j s_j over
//                        the k chosen scores (normalize_topk), else
//                        scaling * s_i.
// With softmax and normalize_topk this equals Megatron's default (softmax over
// the top-k logits); without normalize_topk it is --moe-router-pre-softmax.
// With sigmoid it is Megatron's sigmoid router (normalised when k > 1).
//
// Losses (Megatron's formulas), each a fp32 [1] tensor on the device:
//   load balancing: tokens are in sequence-major order ([s, b] flattened,
//     as the hidden states are), so token t belongs to sequence
//     t % sequences; per sequence, f_e = (its tokens routed to e) / (s * k)
//     and P_e = mean over its tokens of p_te, where p = scores (softmax) or
//     scores / (sum_e scores + 1e-20) (sigmoid); loss = coeff * mean over
//     sequences of E * sum_e f_e P_e. sequences = 1 is
//     --moe-router-load-balancing-type aux_loss (over the whole
//     micro-batch), sequences = b is seq_aux_loss. Only P carries a gradient
//     (f is a count).
//   z-loss: coeff * mean over tokens of logsumexp(logits_t)^2.
//   Under context parallelism a rank holds only part of each sequence:
//     given MoeSequenceTotals, f_e comes from the whole sequences' counts
//     and P_e sums this rank's tokens over the whole length L, so the loss
//     is this rank's share (the shares over the ranks add up to the whole
//     sequences' loss) and its gradient is the whole loss's for these
//     tokens.
// Backwards take the loss's gradient as a host float (grad_scale: the loss
// scale over the micro-batch count, as Megatron's MoEAuxLossAutoScaler).
//
// Sums run in a fixed order (over experts in index order, over tokens in
// token order, in float64 for the losses), so every result is independent of
// the thread count. Arguments are validated before anything is written; each
// op runs its slot's kernel (core/ops/dispatch.h: outputs passed in, the
// device's current stream, no host synchronisation).

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

enum class MoeScoreFunction { kSoftmax, kSigmoid };
// "softmax" or "sigmoid".
const char* MoeScoreFunctionName(MoeScoreFunction f);

struct MoeRouterOptions {
  int64_t topk = 2;
  MoeScoreFunction score_function = MoeScoreFunction::kSoftmax;
  bool normalize_topk = true;
  float scaling_factor = 1.0f;
};

// A one-expert router whose top-1 weight is sigmoid(logit), not
// renormalised: Qwen2-MoE's shared-expert gate through the router's
// kernels (the training model's and the device engine's).
MoeRouterOptions SigmoidGateOptions();

// scores, indices and weights overwritten. expert_bias (fp32 [E]) may be
// null.
absl::Status MoeRouterForward(const Tensor& logits, const Tensor* expert_bias,
                              const MoeRouterOptions& options, Tensor* scores,
                              Tensor* indices, Tensor* weights);

// dlogits [tokens, E] (fp32) overwritten with the gradient through the
// combine weights: dweights [tokens, k] fp32, scores and indices from the
// forward.
absl::Status MoeRouterBackward(const Tensor& scores, const Tensor& indices,
                               const Tensor& dweights,
                               const MoeRouterOptions& options,
                               Tensor* dlogits);

// The whole sequences' statistics when this rank holds part of each.
struct MoeSequenceTotals {
  // int64 [sequences, E] on the scores' device: the slots every token of
  // each whole sequence routed to each expert; null: this rank's, from
  // indices.
  const Tensor* counts = nullptr;
  // Tokens of each whole sequence; 0: this rank's (tokens / sequences).
  int64_t length = 0;
};

// loss [1] (fp32) overwritten. tokens must be a multiple of sequences.
absl::Status MoeLoadBalancingLoss(const Tensor& scores, const Tensor& indices,
                                  MoeScoreFunction score_function,
                                  int64_t sequences, float coeff, Tensor* loss,
                                  const MoeSequenceTotals& totals = {});
// dlogits += grad_scale * d(loss)/d(logits).
absl::Status MoeLoadBalancingLossBackward(const Tensor& scores,
                                          const Tensor& indices,
                                          MoeScoreFunction score_function,
                                          int64_t sequences, float coeff,
                                          float grad_scale, Tensor* dlogits,
                                          const MoeSequenceTotals& totals = {});

// loss [1] (fp32) overwritten.
absl::Status MoeZLoss(const Tensor& logits, float coeff, Tensor* loss);
// dlogits += grad_scale * d(loss)/d(logits).
absl::Status MoeZLossBackward(const Tensor& logits, float coeff,
                              float grad_scale, Tensor* dlogits);

// DeepSeek-V3's bias update after a step: bias_e += rate * sign(mean_e' n_e'
// - n_e), tokens_per_expert int64 [E] (summed over the step), bias fp32 [E]
// updated in place.
absl::Status MoeUpdateExpertBias(const Tensor& tokens_per_expert, float rate,
                                 Tensor* expert_bias);

// Kernels (core/ops/dispatch.h), with the ops' signatures.
using MoeRouterForwardKernel = absl::Status (*)(const Tensor&, const Tensor*,
                                                const MoeRouterOptions&,
                                                Tensor*, Tensor*, Tensor*);
using MoeRouterBackwardKernel = absl::Status (*)(const Tensor&, const Tensor&,
                                                 const Tensor&,
                                                 const MoeRouterOptions&,
                                                 Tensor*);
using MoeLoadBalancingLossKernel = absl::Status (*)(const Tensor&,
                                                    const Tensor&,
                                                    MoeScoreFunction, int64_t,
                                                    float, Tensor*,
                                                    const MoeSequenceTotals&);
using MoeLoadBalancingLossBackwardKernel =
    absl::Status (*)(const Tensor&, const Tensor&, MoeScoreFunction, int64_t,
                     float, float, Tensor*, const MoeSequenceTotals&);
using MoeZLossKernel = absl::Status (*)(const Tensor&, float, Tensor*);
using MoeZLossBackwardKernel = absl::Status (*)(const Tensor&, float, float,
                                                Tensor*);
using MoeUpdateExpertBiasKernel = absl::Status (*)(const Tensor&, float,
                                                   Tensor*);
KernelSlot<MoeRouterForwardKernel>& MoeRouterForwardKernels();
KernelSlot<MoeRouterBackwardKernel>& MoeRouterBackwardKernels();
KernelSlot<MoeLoadBalancingLossKernel>& MoeLoadBalancingLossKernels();
KernelSlot<MoeLoadBalancingLossBackwardKernel>&
MoeLoadBalancingLossBackwardKernels();
KernelSlot<MoeZLossKernel>& MoeZLossKernels();
KernelSlot<MoeZLossBackwardKernel>& MoeZLossBackwardKernels();
KernelSlot<MoeUpdateExpertBiasKernel>& MoeUpdateExpertBiasKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_MOE_ROUTER_H_
