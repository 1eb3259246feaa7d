#ifndef CORE_OPS_ABS_MAX_H_
#define CORE_OPS_ABS_MAX_H_

// The largest magnitude of a tensor, kept on the tensor's device: the amax
// that FP8 scaling (core/fp8_scaling.h) turns into a scale.

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// amax[0] = max |x| over every element of x (fp32, bf16 or fp16); amax is an
// fp32 tensor of one element on x's device, overwritten. Exact (a maximum
// rounds nothing). An empty x gives 0; a NaN anywhere gives NaN; an
// infinity gives infinity. No host synchronisation.
absl::Status AbsMax(const Tensor& x, Tensor* amax);

// Kernel (core/ops/dispatch.h): arguments validated, amax overwritten.
using AbsMaxKernel = absl::Status (*)(const Tensor& x, Tensor* amax);
KernelSlot<AbsMaxKernel>& AbsMaxKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_ABS_MAX_H_
