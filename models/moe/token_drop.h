#ifndef MODELS_MOE_TOKEN_DROP_H_
#define MODELS_MOE_TOKEN_DROP_H_

// Expert capacity and token dropping (--moe-expert-capacity-factor,
// --moe-token-drop-policy), with Megatron-Core's semantics: on each rank's
// own tokens, before any dispatch,
//
//   capacity = ceil(tokens * topk / num_experts * capacity_factor)
//
// and an expert routed more than `capacity` (token, choice) slots keeps
// `capacity` of them: the largest combine weights (policy probs; equal
// weights: the lower token first), or the first tokens (policy position).
// A dropped slot contributes nothing to its token's output and takes no
// gradient (Megatron multiplies the probabilities by the kept mask; the
// other weights are not renormalised). No factor: dropless, the default.
//
// Computed on the host (the routing is small: tokens x topk indices); the
// results are the router's indices and weights with every dropped slot sent
// to the extra expert `num_experts` (a bucket the permutation sorts last and
// no expert computes) and its weight set to zero.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace mcc {
namespace moe {

enum class TokenDropPolicy { kProbs, kPosition };

// "probs" or "position"; anything else is refused, naming the flag.
absl::StatusOr<TokenDropPolicy> ParseTokenDropPolicy(absl::string_view name);
const char* TokenDropPolicyName(TokenDropPolicy policy);

// Megatron's get_capacity for tokens * topk routed slots (factor > 0).
int64_t ExpertCapacity(int64_t tokens, int64_t topk, int64_t num_experts,
                       double capacity_factor);

// indices int32 [tokens, k] and weights fp32 [tokens, k] on the host (the
// router's); dispatch_indices and dispatch_weights are overwritten with the
// same shapes: kept slots as they were, dropped ones at num_experts with
// weight 0. Returns how many slots were dropped.
absl::StatusOr<int64_t> DropOverCapacity(const Tensor& indices,
                                         const Tensor& weights,
                                         int64_t num_experts, int64_t capacity,
                                         TokenDropPolicy policy,
                                         Tensor* dispatch_indices,
                                         Tensor* dispatch_weights);

}  // namespace moe
}  // namespace mcc

#endif  // MODELS_MOE_TOKEN_DROP_H_
