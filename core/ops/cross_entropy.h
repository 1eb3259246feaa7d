#ifndef CORE_OPS_CROSS_ENTROPY_H_
#define CORE_OPS_CROSS_ENTROPY_H_

// Fused softmax cross-entropy over the vocabulary, forward and backward,
// without storing the softmax.
//
//   logits  [tokens, vocab]  fp32 or bf16
//   targets [tokens]         int32 or int64; ignore_index (default -100)
//                            marks tokens without a loss
//   loss    [tokens]         fp32: logsumexp(logits[t]) - logits[t, target];
//                            0 for ignored tokens
//   lse     [tokens]         fp32 per-row logsumexp, saved for the backward
// Backward: dlogits = (softmax(logits) - onehot(target)) * dloss[t], zero
// rows for ignored tokens; dlogits is fp32 or bf16 and may be logits itself
// (in place). A target outside [0, vocab) (other than ignore_index) is an
// error naming the token position, the target and the vocab size: targets
// are data, so the kernel checks them (the CPU kernel before writing
// anything; a device kernel that cannot report it without synchronising
// says what it does instead). Everything else is validated before anything
// is written; all tensors live on one device, and each op runs its slot's
// kernel (core/ops/dispatch.h: outputs passed in, the device's current
// stream, no host synchronisation unless stated).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

inline constexpr int64_t kDefaultIgnoreIndex = -100;

absl::Status CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                 Tensor* loss, Tensor* lse,
                                 int64_t ignore_index = kDefaultIgnoreIndex);

absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, const Tensor& dloss,
                                  Tensor* dlogits,
                                  int64_t ignore_index = kDefaultIgnoreIndex);

// The mean of the per-token losses over the non-ignored tokens only,
// returned to the host: this op synchronises with the device (training
// loops use ops::LossSum, core/ops/loss_sum.h, which stays on the device). Its
// gradient for CrossEntropyBackward is dloss = 1 / count for every token
// (ignored tokens get zero gradient regardless); with data parallelism,
// all-reduce sum and count first and use the global count.
struct MeanLoss {
  double sum = 0.0;
  int64_t count = 0;  // Non-ignored tokens.
  double mean = 0.0;  // sum / count, 0 when count is 0.
};
absl::StatusOr<MeanLoss> CrossEntropyMeanLoss(
    const Tensor& loss, const Tensor& targets,
    int64_t ignore_index = kDefaultIgnoreIndex);

// ---- Cross entropy over a vocabulary split across ranks ------------------
//
// For tensor parallelism (parallel/vocab_parallel.h). Each rank holds
// logits [tokens, local] (fp32, bf16 or fp16) for vocabulary ids
// [vocab_start, vocab_start + local), of which the first `valid` columns
// (0 <= valid <= local) are real; the rest pad the vocabulary, take no
// probability and get zero gradient. targets [tokens] (int32/int64) hold
// global ids, checked by the caller; ignore_index tokens get loss 0 and zero
// gradient. The steps, with the caller's reductions over the ranks between:
//   ShardedCrossEntropyRowMax   row_max[t] = max over valid columns (-inf if
//                               none); all-reduce max.
//   ShardedCrossEntropySums     sums [2, tokens]: row 0 the sum of
//                               exp(logit - row_max) over valid columns
//                               (accumulated in float64), row 1 the target's
//                               logit - row_max on the rank that holds it, 0
//                               elsewhere; all-reduce sum.
//   ShardedCrossEntropyLoss     loss = log(sum) - target term, fp32
//                               [tokens].
//   ShardedCrossEntropyBackward dlogits = (exp(logit - row_max) / sum -
//                               onehot) * dloss[t] on valid columns (the
//                               softmax rounded as a forward would store
//                               it), 0 on padding, in dlogits' dtype (fp32,
//                               bf16 or fp16).
// Outputs are overwritten, never read. exp is Exp8's (about 2 ulp).
absl::Status ShardedCrossEntropyRowMax(const Tensor& logits, int64_t valid,
                                       Tensor* row_max);
absl::Status ShardedCrossEntropySums(const Tensor& logits,
                                     const Tensor& targets,
                                     const Tensor& row_max, int64_t vocab_start,
                                     int64_t valid, Tensor* sums);
absl::Status ShardedCrossEntropyLoss(const Tensor& sums, const Tensor& targets,
                                     int64_t ignore_index, Tensor* loss);
absl::Status ShardedCrossEntropyBackward(
    const Tensor& logits, const Tensor& targets, const Tensor& row_max,
    const Tensor& sums, const Tensor& dloss, int64_t vocab_start, int64_t valid,
    int64_t ignore_index, Tensor* dlogits);

// Kernels, with the ops' signatures and contracts (every output
// overwritten; only CrossEntropyMeanLoss returns a host value).
using CrossEntropyForwardKernel = absl::Status (*)(const Tensor& logits,
                                                   const Tensor& targets,
                                                   Tensor* loss, Tensor* lse,
                                                   int64_t ignore_index);
using CrossEntropyBackwardKernel = absl::Status (*)(
    const Tensor& logits, const Tensor& targets, const Tensor& lse,
    const Tensor& dloss, Tensor* dlogits, int64_t ignore_index);
using CrossEntropyMeanLossKernel = absl::StatusOr<MeanLoss> (*)(
    const Tensor& loss, const Tensor& targets, int64_t ignore_index);
using ShardedCrossEntropyRowMaxKernel = absl::Status (*)(const Tensor& logits,
                                                         int64_t valid,
                                                         Tensor* row_max);
using ShardedCrossEntropySumsKernel = absl::Status (*)(
    const Tensor& logits, const Tensor& targets, const Tensor& row_max,
    int64_t vocab_start, int64_t valid, Tensor* sums);
using ShardedCrossEntropyLossKernel = absl::Status (*)(const Tensor& sums,
                                                       const Tensor& targets,
                                                       int64_t ignore_index,
                                                       Tensor* loss);
using ShardedCrossEntropyBackwardKernel = absl::Status (*)(
    const Tensor& logits, const Tensor& targets, const Tensor& row_max,
    const Tensor& sums, const Tensor& dloss, int64_t vocab_start, int64_t valid,
    int64_t ignore_index, Tensor* dlogits);
KernelSlot<CrossEntropyForwardKernel>& CrossEntropyForwardKernels();
KernelSlot<CrossEntropyBackwardKernel>& CrossEntropyBackwardKernels();
KernelSlot<CrossEntropyMeanLossKernel>& CrossEntropyMeanLossKernels();
KernelSlot<ShardedCrossEntropyRowMaxKernel>& ShardedCrossEntropyRowMaxKernels();
KernelSlot<ShardedCrossEntropySumsKernel>& ShardedCrossEntropySumsKernels();
KernelSlot<ShardedCrossEntropyLossKernel>& ShardedCrossEntropyLossKernels();
KernelSlot<ShardedCrossEntropyBackwardKernel>&
ShardedCrossEntropyBackwardKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CROSS_ENTROPY_H_
