// Launchers for the reduction CUDA kernels of //core/ops/cuda:kernels (the
// Reduce and MultiTensorSumOfSquares slots, core/ops/reduce.h and
// core/ops/multi_tensor.h). Conventions as in elementwise.h.
//
// A tensor's sum (or sum of squares) runs in the CPU kernel's order
// (core/ops/reduce.cc), so the bits agree on every device: values widened
// to float64; blocks of 1024 elements, each summed in 8 lanes (element i
// into lane i % 8, the tail past the last multiple of 8 into lane 0, then
// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))); the block sums added
// in order into partials of 64 blocks; the partials added in order.
#ifndef CORE_OPS_CUDA_REDUCE_H_
#define CORE_OPS_CUDA_REDUCE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// Scratch float64 words a sum of n elements needs.
int64_t OrderedSumScratch(int64_t n);

// *result (device memory) = the sum of x (of squares when square), in the
// order above, using `scratch` (OrderedSumScratch(n) doubles).
cudaError_t OrderedSum(const void* x, ElemType xt, int64_t n, bool square,
                       double* scratch, double* result, cudaStream_t stream);

// *count += the number of zero elements (+0 or -0) of the float tensor x.
cudaError_t CountZeros(const void* x, ElemType xt, int64_t n,
                       unsigned long long* count, cudaStream_t stream);

// The MultiTensorSumOfSquares result from per-tensor sums of squares
// (`sums`: the counted tensors' first, then the checked ones') and zero
// counts (`zeros`, the counted tensors'; null without count_zeros), as the
// CPU kernel forms it: out[0..1] = scale^2 * the counted sums added in
// order (or +inf, 0 when any sum is not finite), out[2..3] = the zeros.
cudaError_t FinishSumOfSquares(const double* sums,
                               const unsigned long long* zeros, int counted,
                               int checked, double scale, float* out,
                               cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_REDUCE_H_
