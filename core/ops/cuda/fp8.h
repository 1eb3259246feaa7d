// Launchers of the FP8 kernels (core/ops/cuda/fp8_kernels.cuh) behind the
// AbsMax and Fp8Gemm slots (core/ops/abs_max.h, core/ops/fp8_gemm.h).
// Conventions as in elementwise.h: device pointers, the given stream, no
// host synchronisation.
#ifndef CORE_OPS_CUDA_FP8_H_
#define CORE_OPS_CUDA_FP8_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// The blocks of AbsMax's first pass: `partial` holds this many words.
int AbsMaxBlocks(int64_t n);

// amax[0] = max |x[i]| over n elements (NaN if any is NaN, 0 if n is 0),
// in two passes through `partial` (AbsMaxBlocks(n) words of scratch).
cudaError_t AbsMax(const void* x, ElemType xt, int64_t n, uint32_t* partial,
                   float* amax, cudaStream_t stream);

// out[i] = fp8(x[i] * scale[0]) as a value (exact in bf16 and fp32: out_t
// kBF16 or kF32), e5m2 or e4m3, rounded to nearest even, saturating.
cudaError_t CastToFp8Values(const void* x, ElemType xt, const float* scale,
                            bool e5m2, void* out, ElemType out_t, int64_t n,
                            cudaStream_t stream);

// FP8 storage (E4M3 or E5M2 codes, core/fp8.h's bits) of x [rows, cols]
// times scale[0]: out [rows, cols], or [cols, rows] when `transpose` (the
// layouts cuBLASLt's FP8 matmul takes).
cudaError_t CastToFp8Bytes(const void* x, ElemType xt, const float* scale,
                           bool e5m2, uint8_t* out, int64_t rows, int64_t cols,
                           bool transpose, cudaStream_t stream);

// out[0] = 1 / first[0], out[1] = 1 / second[0] (cuBLASLt's dequantising
// scale pointers).
cudaError_t Fp8ScaleInverses(const float* first, const float* second,
                             float* out, cudaStream_t stream);

// c[i] = alpha (1/sa) (1/sb) sum[i] + beta c[i] (beta 0: c not read), with
// the factor formed as the CPU kernel forms it and one rounding to c's type.
cudaError_t Fp8Dequantize(const float* sum, const float* sa, const float* sb,
                          float alpha, float beta, void* c, ElemType ct,
                          int64_t n, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FP8_H_
