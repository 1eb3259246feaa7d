// Launchers for the CUDA kernels of the QuantizeWeightFp8 and Fp8WeightGemm
// slots (core/ops/fp8_weight.h); their bodies are in fp8_weight_kernels.cuh.
// Conventions as in elementwise.h: device pointers, the given stream, no
// host synchronisation.
#ifndef CORE_OPS_CUDA_FP8_WEIGHT_H_
#define CORE_OPS_CUDA_FP8_WEIGHT_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// *bad (device memory, set here) = the row-major index r * cols + c of the
// first element of w (wt, [rows, cols]) with !(|w[r, c]| <= absmax[r]) (NaN
// included), as the CPU kernel scans; ~0ull when none. Writes nothing else.
cudaError_t CheckFp8WeightRows(const void* w, ElemType wt, const float* absmax,
                               int64_t rows, int64_t cols,
                               unsigned long long* bad, cudaStream_t stream);

// scales[r] = 448 / absmax[r] (1 for 0) and codes[r, c] = E4M3 bits of
// w[r, c] * scales[r]: the CPU kernel's bytes, bit for bit.
cudaError_t QuantizeWeightFp8(const void* w, ElemType wt, const float* absmax,
                              int64_t rows, int64_t cols, int8_t* codes,
                              float* scales, cudaStream_t stream);

// y [m, n] (yt) = x [m, k] (xt) times the decoded codes [n, k] transposed,
// times 1 / scales[n] (an fp32 reciprocal, once), the sum in fp32 with
// fused multiply-adds. m <= 8 (decode) takes a kernel that reads each
// weight row once with a warp; larger m the 32 x 32 tiled one.
cudaError_t Fp8WeightGemm(const void* x, ElemType xt, const int8_t* codes,
                          const float* scales, void* y, ElemType yt, int64_t m,
                          int64_t n, int64_t k, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FP8_WEIGHT_H_
