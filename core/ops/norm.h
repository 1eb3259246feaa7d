#ifndef CORE_OPS_NORM_H_
#define CORE_OPS_NORM_H_

// LayerNorm and RMSNorm over the last dimension, forward and backward.
//
// x is [..., hidden] (any rank >= 1; rows = numel / hidden), fp32 or bf16;
// gamma and beta are [hidden], fp32 or bf16; y and dx are x's shape, fp32 or
// bf16 (each may differ from x: the kernels compute in fp32 and store in the
// output's dtype). The saved statistics mean and rstd are fp32 with one value
// per row (any shape with `rows` elements, e.g. [rows] or x's leading dims).
//
// Backward overwrites dx and ACCUMULATES (+=) the parameter gradients into
// fp32 [hidden] buffers dgamma and dbeta (either may be null to skip it).
// Everything is validated before anything is written; all tensors live on
// one device. Each op runs its slot's kernel (core/ops/dispatch.h: outputs
// passed in, the device's current stream, no host synchronisation); a device
// without a kernel gets Unimplemented naming the op.

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// y = (x - mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps) with the
// biased variance. Saves mean and rstd for the backward.
absl::Status LayerNormForward(const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, float eps, Tensor* y,
                              Tensor* mean, Tensor* rstd);

absl::Status LayerNormBackward(const Tensor& dy, const Tensor& x,
                               const Tensor& gamma, const Tensor& mean,
                               const Tensor& rstd, Tensor* dx, Tensor* dgamma,
                               Tensor* dbeta);

// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps). Saves rstd.
absl::Status RMSNormForward(const Tensor& x, const Tensor& gamma, float eps,
                            Tensor* y, Tensor* rstd);

absl::Status RMSNormBackward(const Tensor& dy, const Tensor& x,
                             const Tensor& gamma, const Tensor& rstd,
                             Tensor* dx, Tensor* dgamma);

// Kernels, with the ops' signatures and contracts (y, mean, rstd, dx
// overwritten; dgamma, dbeta accumulated; null dgamma/dbeta skipped).
using LayerNormForwardKernel = absl::Status (*)(const Tensor& x,
                                                const Tensor& gamma,
                                                const Tensor& beta, float eps,
                                                Tensor* y, Tensor* mean,
                                                Tensor* rstd);
using LayerNormBackwardKernel = absl::Status (*)(
    const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
    const Tensor& rstd, Tensor* dx, Tensor* dgamma, Tensor* dbeta);
using RMSNormForwardKernel = absl::Status (*)(const Tensor& x,
                                              const Tensor& gamma, float eps,
                                              Tensor* y, Tensor* rstd);
using RMSNormBackwardKernel = absl::Status (*)(const Tensor& dy,
                                               const Tensor& x,
                                               const Tensor& gamma,
                                               const Tensor& rstd, Tensor* dx,
                                               Tensor* dgamma);
KernelSlot<LayerNormForwardKernel>& LayerNormForwardKernels();
KernelSlot<LayerNormBackwardKernel>& LayerNormBackwardKernels();
KernelSlot<RMSNormForwardKernel>& RMSNormForwardKernels();
KernelSlot<RMSNormBackwardKernel>& RMSNormBackwardKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_NORM_H_
