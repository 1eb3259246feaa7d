#ifndef CORE_OPS_LOSS_SUM_H_
#define CORE_OPS_LOSS_SUM_H_

// The loss of a micro-batch, summed on the device: per-token losses (from
// the cross entropy) times an optional loss mask, over the tokens that have
// a label, with the token count beside the sum. The trainer reads the
// result once per step with the gradient norm (one device-to-host copy);
// nothing here synchronises with the host.
//
// A loss sum is an fp32 [4] tensor holding two float64 values, each split
// in two fp32 halves (v = double(hi) + double(lo), hi = float(v),
// lo = float(v - hi)), so it can be all-reduced in fp32 and keeps about 48
// bits:
//   [0] + [1]  sum over tokens t with labels[t] != ignore_index of
//              double(loss[t]) * mask[t]
//   [2] + [3]  sum of mask[t] over the same tokens (their count when there
//              is no mask)
// Sums run in token order in float64, so every device gives the same bits.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// loss fp32 [tokens]; mask fp32 [tokens] or an undefined tensor (every
// token weighs 1); labels int32 or int64 [tokens]; out fp32 [4]. Overwrites
// out, or with accumulate adds to the values already in it (a step's total
// over micro-batches).
absl::Status LossSum(const Tensor& loss, const Tensor& mask,
                     const Tensor& labels, int64_t ignore_index,
                     bool accumulate, Tensor* out);

// The gradient of (loss sum / token count) * grad_scale with respect to the
// per-token losses: dloss[t] = mask[t] * s (1 * s without a mask), where
// s = grad_scale / float(tokens) with tokens read from loss_sum ([2] + [3]),
// and s = 0 when tokens is 0. Ignored tokens get the same value; the cross
// entropy's backward gives them no gradient. dloss fp32 [tokens],
// overwritten.
absl::Status LossSumGradient(const Tensor& loss_sum, const Tensor& mask,
                             float grad_scale, Tensor* dloss);

using LossSumKernel = absl::Status (*)(const Tensor& loss, const Tensor& mask,
                                       const Tensor& labels,
                                       int64_t ignore_index, bool accumulate,
                                       Tensor* out);
using LossSumGradientKernel = absl::Status (*)(const Tensor& loss_sum,
                                               const Tensor& mask,
                                               float grad_scale, Tensor* dloss);
KernelSlot<LossSumKernel>& LossSumKernels();
KernelSlot<LossSumGradientKernel>& LossSumGradientKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_LOSS_SUM_H_
