#ifndef CORE_OPS_ROTARY_H_
#define CORE_OPS_ROTARY_H_

// Rotary position embedding (RoPE) as in Megatron-LM and GPT-NeoX: the
// "rotate-half" form applied to the first rotary_dim of each head's dims.
//
// Layout: x is [batch, seq, heads, head_dim] (the layout of the whole
// attention stack here: q/k/v and the attention output are [b, s, h, d], so
// the QKV projection's [b*s, h*d] output and the output projection's input
// are plain reshapes). For pair i < rotary_dim/2 of the token at sequence
// index t, with theta = (t + position_offset) * inv_freq[i] and
// inv_freq = RotaryInverseFrequencies(options, rotary_dim) (base^(-2i /
// rotary_dim), rescaled when options.llama3 is on):
//   y[i]        = x[i] * cos(theta) - x[i + r/2] * sin(theta)
//   y[i + r/2]  = x[i + r/2] * cos(theta) + x[i] * sin(theta)
// and dims >= rotary_dim pass through. The backward is the rotation by
// -theta. Angles are computed in float64, applied in fp32; x/y may be fp32 or
// bf16 independently, and y may be x itself (in place). Everything is
// validated before anything is written; all tensors live on one device and
// each op runs its slot's kernel (core/ops/dispatch.h).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// Llama 3.x's rescaling of the rotary frequencies (Hugging Face's
// rope_scaling of rope_type "llama3"; Megatron's --use-rope-scaling). With
// wavelength w = 2 pi / inv_freq and L = original_max_position_embeddings:
// w < L / high_freq_factor keeps inv_freq, w > L / low_freq_factor divides it
// by factor, and in between it is interpolated:
//   s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor),
//   inv_freq' = (1 - s) * inv_freq / factor + s * inv_freq.
struct Llama3RopeScaling {
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;

  bool operator==(const Llama3RopeScaling& o) const {
    return enabled == o.enabled && factor == o.factor &&
           low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor &&
           original_max_position_embeddings ==
               o.original_max_position_embeddings;
  }
};

// The parameters' own check (factor >= 1, 0 < low < high, L > 0); OK when
// not enabled. Messages name the parameter as Hugging Face's rope_scaling
// does.
absl::Status ValidateLlama3RopeScaling(const Llama3RopeScaling& scaling);

struct RotaryOptions {
  int64_t rotary_dim = 0;  // 0: the whole head_dim. Must be even.
  double base = 10000.0;
  // Position of sequence index 0 (tokens already in a KV cache).
  int64_t position_offset = 0;
  Llama3RopeScaling llama3;
};

// inv_freq[i] for i < rotary_dim / 2, in float64: base^(-2i / rotary_dim),
// then options.llama3's rescaling when enabled. Every kernel and the
// inference engine take their angles from here.
std::vector<double> RotaryInverseFrequencies(const RotaryOptions& options,
                                             int64_t rotary_dim);

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
