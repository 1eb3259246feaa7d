#ifndef CORE_OPS_ELEMENTWISE_H_
#define CORE_OPS_ELEMENTWISE_H_

// Elementwise ops that the model, the optimizer and the parallel layers use
// instead of touching host pointers: fill, dtype conversion, scaling, sums
// and accumulation. Each validates its arguments (every tensor defined and
// on one device) and runs its slot's kernel (core/ops/dispatch.h: outputs
// passed in, the device's current stream, no host synchronisation).
//
// Floating arithmetic is fp32 whatever the storage dtype: 16-bit inputs are
// widened exactly, and a 16-bit output is rounded once (to nearest even).
// "Float" below means fp32, bf16 or fp16; operands of one op may mix them.

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"
#include "core/tensor_kernels.h"

namespace mcc {
namespace ops {

// x = value everywhere (any dtype; value converted as Tensor::Fill does).
// Overwrites x. The slot is core's FillKernels(), which Tensor::Fill, Zero,
// Full and Zeros use too.
absl::Status Fill(double value, Tensor* x);

// dst = src converted to dst's dtype (any dtypes; the rules of
// ConvertElements). Same element count (shapes may differ), and src and dst
// must not overlap unless they are the same elements in the same dtype.
// Overwrites dst. The slot is core's ConvertKernels(), which
// Tensor::To(DType) uses too.
absl::Status Convert(const Tensor& src, Tensor* dst);

// y = alpha * x. Float x and y with the same element count; y may be x (in
// place: DDP's 1/DP gradient scaling). Overwrites y.
absl::Status Scale(const Tensor& x, float alpha, Tensor* y);

// y = a + b (a residual connection). Float a, b, y of one element count; y
// may be a or b. Overwrites y.
absl::Status Add(const Tensor& a, const Tensor& b, Tensor* y);

// y += alpha * x, as one fused multiply-add in fp32 (fmaf(alpha, x, y),
// then y's rounding). Float x and y of one element count, not overlapping
// (gradient accumulation: FSDP's reduced shard into the gradient shard).
absl::Status Accumulate(const Tensor& x, float alpha, Tensor* y);

using ScaleKernel = absl::Status (*)(const Tensor& x, float alpha, Tensor* y);
using AddKernel = absl::Status (*)(const Tensor& a, const Tensor& b, Tensor* y);
using AccumulateKernel = absl::Status (*)(const Tensor& x, float alpha,
                                          Tensor* y);
KernelSlot<ScaleKernel>& ScaleKernels();
KernelSlot<AddKernel>& AddKernels();
KernelSlot<AccumulateKernel>& AccumulateKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_ELEMENTWISE_H_
