// Launcher for the rotary-embedding CUDA kernel of //core/ops/cuda:kernels
// (the RotaryForward and RotaryBackward slots, core/ops/rotary.h).
// Conventions as in elementwise.h.
#ifndef CORE_OPS_CUDA_ROTARY_H_
#define CORE_OPS_CUDA_ROTARY_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// The rotation's constants. inv_freq[i] (base^(-2i / rotary_dim), rescaled
// for Llama 3) is computed on the host by RotaryInverseFrequencies, as the
// CPU kernel's is, so theta =
// (t + position_offset) * inv_freq[i] is the CPU's float64 value; its cos
// and sin (float64, within 2 ulp) are rounded to fp32, so they differ from
// the CPU's by at most one fp32 ulp, and only where a value lies that close
// to a rounding boundary.
struct RotaryArgs {
  static constexpr int kMaxHalf = 128;  // rotary_dim up to 256
  double inv_freq[kMaxHalf] = {};
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0, rotary_dim = 0;
  int64_t position_offset = 0;
  float sign = 1.0f;  // +1 forward (theta), -1 backward (-theta)
};

// y = x rotated over x [batch, seq, heads, head_dim] (rotate-half form on
// the first rotary_dim dims, the rest copied unless y is x).
cudaError_t Rotary(const RotaryArgs& args, const void* x, ElemType xt, void* y,
                   ElemType yt, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_ROTARY_H_
