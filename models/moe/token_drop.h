#ifndef MODELS_MOE_TOKEN_DROP_H_
#define MODELS_MOE_TOKEN_DROP_H_

// Expert capacity and token dropping (--moe-expert-capacity-factor,
// --moe-token-drop-policy), with Megatron-Core's semantics: on each rank's
// own tokens (under context parallelism, on the whole micro-batch the CP
// ranks share: DropOverCapacityInContext), before any dispatch,
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

// Under context parallelism (C ranks, each holding chunks c and 2C - 1 - c
// of every sequence: parallel/context_parallel/chunk_layout.h), with the
// serial run's result: the slots of all C ranks, gathered in rank order
// (rank c's [t, k] rows at [c t, (c + 1) t), its row r token r / sequences
// of sequence r % sequences), are put in the serial micro-batch's token
// order, dropped over its capacity, ExpertCapacity(C t, ...), and this
// rank's rows written to dispatch_*. Megatron drops over each CP rank's own
// tokens instead; that choice depends on the split of the sequences, so it
// does not equal the serial run. Returns the slots dropped on this rank.
absl::StatusOr<int64_t> DropOverCapacityInContext(
    const Tensor& gathered_indices, const Tensor& gathered_weights,
    int64_t sequences, int context_size, int context_rank, int64_t num_experts,
    double capacity_factor, TokenDropPolicy policy, Tensor* dispatch_indices,
    Tensor* dispatch_weights);

}  // namespace moe
}  // namespace mcc

#endif  // MODELS_MOE_TOKEN_DROP_H_
