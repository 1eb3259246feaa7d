#ifndef CORE_OPS_REDUCE_H_
#define CORE_OPS_REDUCE_H_

// Whole-tensor reductions with float64 accumulation, for gradient norms,
// loss sums and checks. Results are independent of the thread count (fixed
// blocks summed in order). Any inf or NaN element makes the result inf or
// NaN, which is how callers detect non-finite gradients.

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

// Device kernels: the sum (square = false) or sum of squares of x.
using ReduceKernel = absl::StatusOr<double> (*)(const Tensor& x, bool square);
KernelSlot<ReduceKernel>& ReduceKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_REDUCE_H_
