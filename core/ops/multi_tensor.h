#ifndef CORE_OPS_MULTI_TENSOR_H_
#define CORE_OPS_MULTI_TENSOR_H_

// Reductions over a list of tensors whose result stays on the device: the
// gradient norm of a training step is one op on every gradient, written into
// a small device tensor that the trainer reads once per step (one
// device-to-host copy with the loss), instead of one host value per
// parameter.

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

struct SumOfSquaresOptions {
  // Every element is multiplied by scale before squaring (1 / loss scale);
  // the sum is computed as sum(x^2) * (scale * scale) in float64.
  double scale = 1.0;
  // Whether out[2..3] count the zero elements of `counted`.
  bool count_zeros = false;
};

// out (fp32 [4], on the tensors' device) is overwritten with
//   out[0] + out[1] = scale^2 * the sum of squares of every element of the
//                     `counted` tensors, as a float64 split in two fp32
//                     halves (out[0] = float(s), out[1] = float(s - out[0]))
//                     so it survives an fp32 all-reduce to about 48 bits;
//   out[2] + out[3] = the number of zero elements of `counted` (the same
//                     split; 0 unless options.count_zeros).
// Any inf or NaN element in `counted` or `checked` (tensors that are only
// checked, e.g. gradients another rank counts) makes out[0] = +inf and
// out[1] = 0, which is how the trainer detects an overflow.
// Tensors are fp32, bf16 or fp16, any shapes, all on out's device. Each
// tensor's sum is accumulated in float64 as ops::SumOfSquares does, and the
// per-tensor sums are added in list order, so the result is the same on
// every device and thread count. No host synchronisation.
absl::Status MultiTensorSumOfSquares(absl::Span<const Tensor> counted,
                                     absl::Span<const Tensor> checked,
                                     const SumOfSquaresOptions& options,
                                     Tensor* out);

using MultiTensorSumOfSquaresKernel = absl::Status (*)(
    absl::Span<const Tensor> counted, absl::Span<const Tensor> checked,
    const SumOfSquaresOptions& options, Tensor* out);
KernelSlot<MultiTensorSumOfSquaresKernel>& MultiTensorSumOfSquaresKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_MULTI_TENSOR_H_
