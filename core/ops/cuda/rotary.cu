#include "core/ops/cuda/kernel_util.cuh"
#include "core/ops/cuda/rotary.h"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;
using internal::kThreads;
using internal::LoadAs;
using internal::StoreAs;

// One thread per (row, head, dim j): j < half rotates the pair (j, j +
// half), half <= j < rotary_dim does nothing (its pair's thread writes it),
// j >= rotary_dim copies unless in place.
__global__ void RotaryKernel(RotaryArgs a, const void* x, ElemType xt, void* y,
                             ElemType yt, bool in_place) {
  const int64_t half = a.rotary_dim / 2;
  const int64_t n = a.batch * a.seq * a.heads * a.head_dim;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t j = i % a.head_dim;
    if (j >= a.rotary_dim) {
      if (!in_place) StoreAs(y, yt, i, LoadAs(x, xt, i));
      continue;
    }
    if (j >= half) continue;
    const int64_t t = (i / (a.heads * a.head_dim)) % a.seq;
    const double theta =
        static_cast<double>(t + a.position_offset) * a.inv_freq[j];
    const float c = static_cast<float>(cos(theta));
    const float s = static_cast<float>(sin(theta)) * a.sign;
    const float x1 = LoadAs(x, xt, i), x2 = LoadAs(x, xt, i + half);
    StoreAs(y, yt, i, x1 * c - x2 * s);
    StoreAs(y, yt, i + half, x2 * c + x1 * s);
  }
}

}  // namespace

cudaError_t Rotary(const RotaryArgs& args, const void* x, ElemType xt, void* y,
                   ElemType yt, cudaStream_t stream) {
  const int64_t n = args.batch * args.seq * args.heads * args.head_dim;
  if (n == 0) return cudaSuccess;
  RotaryKernel<<<GridFor(n), kThreads, 0, stream>>>(args, x, xt, y, yt, x == y);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
