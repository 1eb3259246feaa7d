#ifndef PARALLEL_CONTEXT_PARALLEL_SOFTMAX_MERGE_H_
#define PARALLEL_CONTEXT_PARALLEL_SOFTMAX_MERGE_H_

// Merging attention computed over disjoint sets of keys (the blocks of ring
// attention) with the online-softmax statistics: for one query row, a
// partial result over keys K1 is o1 = softmax(S1) V1 with l1 = logsumexp(S1).
// Over K1 and K2 together
//   l = log(exp(l1) + exp(l2)),  o = exp(l1 - l) o1 + exp(l2 - l) o2,
// computed from the larger of l1, l2 so nothing overflows. A row that has
// seen no key yet has l = -inf and o = 0, so a running result starts there.
//
// Layout (core/ops/attention.h's): out [b, s, heads, d], lse [b, heads, s],
// all fp32, on one device. The op validates everything first (errors name
// the op and the tensor; nothing is written on error) and runs its slot's
// kernel on the device's current stream, without host synchronisation; a
// device without a kernel gets Unimplemented naming the op. Host-backed
// devices run the CPU kernel.

#include "absl/status/status.h"
#include "core/kernel_slot.h"
#include "core/tensor.h"

namespace mcc {
namespace context_parallel {

// (out, lse) = merge of (out, lse) and (part_out, part_lse), in place.
absl::Status MergeAttentionPartial(const Tensor& part_out,
                                   const Tensor& part_lse, Tensor* out,
                                   Tensor* lse);

using MergeAttentionPartialKernel = absl::Status (*)(const Tensor& part_out,
                                                     const Tensor& part_lse,
                                                     Tensor* out, Tensor* lse);
KernelSlot<MergeAttentionPartialKernel>& MergeAttentionPartialKernels();

}  // namespace context_parallel
}  // namespace mcc

#endif  // PARALLEL_CONTEXT_PARALLEL_SOFTMAX_MERGE_H_
