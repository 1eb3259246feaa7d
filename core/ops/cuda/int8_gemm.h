// Launcher for the CUDA kernel of the Int8Gemm slot (core/ops/int8_gemm.h).
// Conventions as in elementwise.h.
//
// y[i, j] = s[j] * sum_p x[i, p] * q[j, p], with the contract's numerics: x
// (fp32, bf16 or fp16) and q widened exactly to fp32, the k products summed
// in fp32 (fused multiply-adds in order p = 0, 1, ..., k - 1: each product
// exact, one rounding per addition), one multiplication by s[j], one
// rounding to y's type. So the op's bound, (gamma_k + u (1 + gamma_k)) s
// sum |x q|, holds here too.
//
// A tiled SIMT kernel (32 x 32 outputs per block, panels of 32 along k
// through shared memory): it reads each weight once per 32 rows of x, so
// decode shapes (few rows) stream the int8 weights at a quarter of fp32's
// bytes. Not tuned further (no tensor cores: the contract keeps x unrounded,
// and int8 tensor-core products would need int8 activations).
#ifndef CORE_OPS_CUDA_INT8_GEMM_H_
#define CORE_OPS_CUDA_INT8_GEMM_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// x [m, k] (xt), q int8 [n, k], scales [n], y [m, n] (yt), all row-major and
// contiguous; y is overwritten.
cudaError_t Int8Gemm(const void* x, ElemType xt, const int8_t* q,
                     const float* scales, void* y, ElemType yt, int64_t m,
                     int64_t n, int64_t k, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_INT8_GEMM_H_
