#ifndef CORE_OPS_BIAS_H_
#define CORE_OPS_BIAS_H_

// Bias addition over the last dimension.

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "core/half.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// y = x + bias, bias [h] broadcast over x [..., h]; y has x's shape. Each of
// x, bias, y is fp32 or bf16; y may be x itself (in place).
absl::Status BiasAdd(const Tensor& x, const Tensor& bias, Tensor* y);

// The bias gradient: dbias [h] (fp32) += dy [..., h] summed over every
// leading index. (dx is dy itself.) The row order of the sum is fixed, so
// the result does not depend on the thread count.
absl::Status BiasAddBackward(const Tensor& dy, Tensor* dbias);

// Kernels (core/ops/dispatch.h), with the ops' signatures: y overwritten,
// dbias accumulated; the device's current stream, no host synchronisation.
using BiasAddKernel = absl::Status (*)(const Tensor& x, const Tensor& bias,
                                       Tensor* y);
using BiasAddBackwardKernel = absl::Status (*)(const Tensor& dy, Tensor* dbias);
KernelSlot<BiasAddKernel>& BiasAddKernels();
KernelSlot<BiasAddBackwardKernel>& BiasAddBackwardKernels();

namespace internal {
// Shared with the fused bias kernels: checks bias [h] against x [..., h].
absl::Status CheckBias(const char* op, const Tensor& x, const char* x_name,
                       const Tensor& bias);
// Calls row_fn(r, acc) for every row r of a rows x h matrix, where acc
// (fp32 [h]) is the partial column sum of r's group of rows, to which row_fn
// adds row r; then dbias += the partials summed in group order in float64.
// Rows run in parallel by group; the result ignores the thread count.
void ForRowsWithColumnSums(
    int64_t rows, int64_t h,
    const std::function<void(int64_t row, float* acc)>& row_fn, float* dbias);
// dbias [h] += column sums of the rows x h matrix dy, deterministic.
void AccumulateColumnSums(const float* dy, int64_t rows, int64_t h,
                          float* dbias);
void AccumulateColumnSums(const BFloat16* dy, int64_t rows, int64_t h,
                          float* dbias);
void AccumulateColumnSums(const Float16* dy, int64_t rows, int64_t h,
                          float* dbias);
}  // namespace internal

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_BIAS_H_
