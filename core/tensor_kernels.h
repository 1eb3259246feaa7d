#ifndef CORE_TENSOR_KERNELS_H_
#define CORE_TENSOR_KERNELS_H_

// The slots of the tensor primitives that Tensor itself needs on every
// device: filling with a value (Tensor::Fill, Zero, Full, Zeros) and dtype
// conversion (Tensor::To(DType)). They live in core, beside Tensor, because
// core cannot depend on core/ops; core/ops/elementwise.h exposes them as
// ops (ops::Fill, ops::Convert) with the same slots, so a device library
// registers each kernel once:
//   FillKernels().Register(DeviceType::kCUDA, &CudaFill);
// Kernels keep the contract of core/ops/dispatch.h.

#include "absl/status/status.h"
#include "core/kernel_slot.h"
#include "core/tensor.h"

namespace mcc {

// Every element of x = value converted to x's dtype (16-bit floats round
// to nearest even, integers truncate toward zero). Overwrites x.
using FillKernel = absl::Status (*)(double value, Tensor* x);
KernelSlot<FillKernel>& FillKernels();

// dst = src converted to dst's dtype element by element (the rules of
// ConvertElements); src and dst have the same element count and device and
// do not overlap unless they are the same tensor with the same dtype.
// Overwrites dst.
using ConvertKernel = absl::Status (*)(const Tensor& src, Tensor* dst);
KernelSlot<ConvertKernel>& ConvertKernels();

}  // namespace mcc

#endif  // CORE_TENSOR_KERNELS_H_
