#ifndef CORE_OPS_ROTARY_H_
#define CORE_OPS_ROTARY_H_

// Rotary position embedding (RoPE) as in Megatron-LM and GPT-NeoX: the
// "rotate-half" form applied to the first rotary_dim of each head's dims.
//
// Layout: x is [batch, seq, heads, head_dim] (the layout of the whole
// attention stack here: q/k/v and the attention output are [b, s, h, d], so
// the QKV projection's [b*s, h*d] output and the output projection's input
// are plain reshapes). For pair i < rotary_dim/2 of the token at sequence
// index t, with theta = (t + position_offset) * base^(-2i / rotary_dim):
//   y[i]        = x[i] * cos(theta) - x[i + r/2] * sin(theta)
//   y[i + r/2]  = x[i + r/2] * cos(theta) + x[i] * sin(theta)
// and dims >= rotary_dim pass through. The backward is the rotation by
// -theta. Angles are computed in float64, applied in fp32; x/y may be fp32 or
// bf16 independently, and y may be x itself (in place). Everything is
// validated before anything is written; all tensors live on one device and
// each op runs its slot's kernel (core/ops/dispatch.h).

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

struct RotaryOptions {
  int64_t rotary_dim = 0;  // 0: the whole head_dim. Must be even.
  double base = 10000.0;
  // Position of sequence index 0 (tokens already in a KV cache).
  int64_t position_offset = 0;
};

absl::Status RotaryForward(const Tensor& x, const RotaryOptions& options,
                           Tensor* y);

// dx = rotation of dy by -theta. dx may be dy itself.
absl::Status RotaryBackward(const Tensor& dy, const RotaryOptions& options,
                            Tensor* dx);

// Kernels, with the ops' signatures and contracts (y overwritten; y may be
// x itself, never a partial overlap).
using RotaryKernel = absl::Status (*)(const Tensor& x,
                                      const RotaryOptions& options, Tensor* y);
KernelSlot<RotaryKernel>& RotaryForwardKernels();
KernelSlot<RotaryKernel>& RotaryBackwardKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_ROTARY_H_
