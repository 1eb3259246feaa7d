#ifndef CORE_OPS_MOE_PERMUTE_H_
#define CORE_OPS_MOE_PERMUTE_H_

// Token permutation for mixture-of-experts layers: the copies of each
// token's hidden state that go to its k experts, grouped by expert, and the
// weighted sum that brings the experts' outputs back (dropless: every
// routed copy is kept).
//
// A "slot" is one (token, choice) pair, numbered t * k + i as in the
// router's indices [tokens, k] (core/ops/moe_router.h). MoeSortTokens orders
// the slots by expert, then token, then choice (a stable counting sort), so
// permuted row r holds slot row_to_slot[r], expert e's rows are
// [sum_{e' < e} n_e', sum_{e' <= e} n_e'), and slot_to_row is the inverse.
//
//   permute:    permuted[r] = x[row_to_slot[r] / k]
//   unpermute:  y[t] = sum over i = 0, 1, ..., k - 1 (in that order) of
//               weights[t, i] * expert_out[slot_to_row[t * k + i]]
// Their backwards are each other's transpose: dx = unpermute(dpermuted)
// without weights; dexpert_out[slot_to_row[s]] = weights[s] * dy[s / k] and
// dweights[s] = <dy[s / k], expert_out[slot_to_row[s]]>.
//
// Every output element is computed by one thread in a fixed order, so the
// results are bit-identical across runs and thread counts. Activations are
// fp32, bf16 or fp16, one dtype per op; sums run in fp32 (dweights' dot
// products in float64) and are rounded once. Index tensors are int32.
// Arguments are validated before anything is written (the CPU kernels check
// index values too); each op runs its slot's kernel (core/ops/dispatch.h:
// outputs passed in and overwritten, the device's current stream, no host
// synchronisation).

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// indices int32 [tokens, k] with values in [0, num_experts); row_to_slot
// and slot_to_row int32 [tokens * k]; tokens_per_expert int64 [num_experts].
absl::Status MoeSortTokens(const Tensor& indices, int64_t num_experts,
                           Tensor* row_to_slot, Tensor* slot_to_row,
                           Tensor* tokens_per_expert);

// x [tokens, h], row_to_slot [tokens * k], permuted [tokens * k, h].
absl::Status MoePermute(const Tensor& x, const Tensor& row_to_slot,
                        Tensor* permuted);

// expert_out [tokens * k, h], slot_to_row [tokens * k], weights fp32
// [tokens, k] or null (all ones), y [tokens, h].
absl::Status MoeUnpermute(const Tensor& expert_out, const Tensor& slot_to_row,
                          const Tensor* weights, Tensor* y);

// dx [tokens, h] from dpermuted [tokens * k, h]: MoeUnpermute without
// weights.
absl::Status MoePermuteBackward(const Tensor& dpermuted,
                                const Tensor& slot_to_row, Tensor* dx);

// dexpert_out [tokens * k, h] and, when weights is given, dweights fp32
// [tokens, k] (null without weights).
absl::Status MoeUnpermuteBackward(const Tensor& dy, const Tensor& expert_out,
                                  const Tensor& slot_to_row,
                                  const Tensor* weights, Tensor* dexpert_out,
                                  Tensor* dweights);

// Kernels (core/ops/dispatch.h), with the ops' signatures.
using MoeSortTokensKernel = absl::Status (*)(const Tensor&, int64_t, Tensor*,
                                             Tensor*, Tensor*);
using MoePermuteKernel = absl::Status (*)(const Tensor&, const Tensor&,
                                          Tensor*);
using MoeUnpermuteKernel = absl::Status (*)(const Tensor&, const Tensor&,
                                            const Tensor*, Tensor*);
using MoeUnpermuteBackwardKernel = absl::Status (*)(const Tensor&,
                                                    const Tensor&,
                                                    const Tensor&,
                                                    const Tensor*, Tensor*,
                                                    Tensor*);
KernelSlot<MoeSortTokensKernel>& MoeSortTokensKernels();
KernelSlot<MoePermuteKernel>& MoePermuteKernels();
KernelSlot<MoeUnpermuteKernel>& MoeUnpermuteKernels();
KernelSlot<MoeUnpermuteBackwardKernel>& MoeUnpermuteBackwardKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_MOE_PERMUTE_H_
