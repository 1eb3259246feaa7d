#ifndef CORE_OPS_REDUCE_H_
#define CORE_OPS_REDUCE_H_

// Whole-tensor reductions with float64 accumulation, for checks and tests.
// They return a host value, so on a device they synchronise with it (the
// training step uses MultiTensorSumOfSquares, core/ops/multi_tensor.h, and
// LossSum, core/ops/loss_sum.h, which stay on the device). Results are
// independent of the thread count (fixed blocks summed in order). Any inf or
// NaN element makes the result inf or NaN, which is how callers detect
// non-finite gradients.

#include "absl/status/statusor.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// Sum of the elements of an fp32 or bf16 tensor.
absl::StatusOr<double> Sum(const Tensor& x);
// Sum of squares.
absl::StatusOr<double> SumOfSquares(const Tensor& x);
// sqrt(SumOfSquares(x)).
absl::StatusOr<double> L2Norm(const Tensor& x);

// The kernel (core/ops/dispatch.h): the sum (square = false) or sum of
// squares of x, returned to the host (so a device kernel synchronises).
using ReduceKernel = absl::StatusOr<double> (*)(const Tensor& x, bool square);
KernelSlot<ReduceKernel>& ReduceKernels();

namespace internal {
// The CPU kernel's sum of squares of a CPU (or host-view) float tensor,
// shared with the multi-tensor kernel so the two agree bit for bit.
double SumOfSquaresCpu(const Tensor& x);
}  // namespace internal

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_REDUCE_H_
