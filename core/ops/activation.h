#ifndef CORE_OPS_ACTIVATION_H_
#define CORE_OPS_ACTIVATION_H_

// Activations of the transformer MLP, forward and backward: GELU (tanh form,
// as Megatron's), GELU fused with the preceding bias (Megatron's
// bias_gelu_fusion), and SwiGLU. Inputs and outputs are fp32, bf16 or fp16
// each; the arithmetic is fp32, to a relative error of about 3e-6 before the
// output's rounding, except for bf16 forward outputs (about 7.6e-5, a
// twentieth of the 2^-9 that keeps them within one bf16 ulp), on every x86
// CPU alike (activation.cc states the bounds). Input gradients are overwritten;
// the bias gradient (fp32) is accumulated.

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); y has x's shape and
// may be x itself.
absl::Status Gelu(const Tensor& x, Tensor* y);
// dx = dy * gelu'(x).
absl::Status GeluBackward(const Tensor& dy, const Tensor& x, Tensor* dx);

// y = gelu(x + bias), bias [h] over x [..., h].
absl::Status BiasGelu(const Tensor& x, const Tensor& bias, Tensor* y);
// dx = dy * gelu'(x + bias); dbias (fp32 [h]) += dx summed over rows.
absl::Status BiasGeluBackward(const Tensor& dy, const Tensor& x,
                              const Tensor& bias, Tensor* dx, Tensor* dbias);

// x [..., 2h] split into halves a = x[..., :h], b = x[..., h:];
// y [..., h] = silu(a) * b, silu(a) = a * sigmoid(a) (Megatron's swiglu).
absl::Status SwiGLU(const Tensor& x, Tensor* y);
// dx [..., 2h] = [dy * b * silu'(a), dy * silu(a)].
absl::Status SwiGLUBackward(const Tensor& dy, const Tensor& x, Tensor* dx);

// Kernels (core/ops/dispatch.h), with the ops' signatures: y and dx
// overwritten, dbias accumulated; the device's current stream, no host
// synchronisation.
using UnaryKernel = absl::Status (*)(const Tensor& x, Tensor* y);
using UnaryBackwardKernel = absl::Status (*)(const Tensor& dy, const Tensor& x,
                                             Tensor* dx);
using BiasGeluKernel = absl::Status (*)(const Tensor& x, const Tensor& bias,
                                        Tensor* y);
using BiasGeluBackwardKernel = absl::Status (*)(const Tensor& dy,
                                                const Tensor& x,
                                                const Tensor& bias, Tensor* dx,
                                                Tensor* dbias);
KernelSlot<UnaryKernel>& GeluKernels();
KernelSlot<UnaryBackwardKernel>& GeluBackwardKernels();
KernelSlot<BiasGeluKernel>& BiasGeluKernels();
KernelSlot<BiasGeluBackwardKernel>& BiasGeluBackwardKernels();
KernelSlot<UnaryKernel>& SwiGLUKernels();
KernelSlot<UnaryBackwardKernel>& SwiGLUBackwardKernels();

namespace internal {

// Test seam for the bf16 forward path's reciprocal (activation.cc,
// Bf16Precision), so that its accuracy is tested against vrcpps's documented
// bound rather than against this CPU's implementation of it.
enum class Bf16RecipForTesting {
  kShipped,    // as Gelu, BiasGelu and SwiGLU run: IEEE division
  kRcp,        // raw vrcpps (or its stand-in): the path before issue 16
  kRcpNewton,  // vrcpps (or its stand-in) plus one Newton step
};
// What stands in for vrcpps in kRcp and kRcpNewton.
enum class RcpForTesting {
  kHardware,   // vrcpps itself
  kBoundLow,   // (1 / d) (1 - 1.5 * 2^-12), the bound's worst case
  kBoundHigh,  // (1 / d) (1 + 1.5 * 2^-12)
};
// Gelu (bias null) or BiasGelu, and SwiGLU, on CPU tensors with the
// arithmetic of the bf16 forward path whatever y's dtype (y bf16: what the
// ops give for kShipped; y fp32: the value before that rounding).
// Unimplemented without AVX2.
absl::Status GeluBf16PathForTesting(const Tensor& x, const Tensor* bias,
                                    Tensor* y, Bf16RecipForTesting recip,
                                    RcpForTesting rcp);
absl::Status SwiGLUBf16PathForTesting(const Tensor& x, Tensor* y,
                                      Bf16RecipForTesting recip,
                                      RcpForTesting rcp);

}  // namespace internal

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_ACTIVATION_H_
