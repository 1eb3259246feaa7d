// Fp8Gemm (core/ops/fp8_gemm.h) through cuBLASLt's native FP8 matmul (sm_89
// and later; twice bf16's tensor-core rate on Hopper): the operands cast to
// FP8 storage on the device, the dequantising 1/s of each passed as
// CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER (no host synchronisation), fp32
// accumulation, C in fp32, bf16 or fp16.
//
// cuBLASLt's FP8 kernels take only the "TN" layout: in its column-major
// terms the first operand transposed and the second not. Row-major
// c [M, N] = op(a) op(b) is column-major c^T = op(b)^T op(a)^T, so the
// first operand is b's FP8 copy as row-major [N, K] and the second a's as
// [M, K]: b is copied transposed unless trans_b, a unless !trans_a (the
// forward y = x W^T maps directly; dgrad and wgrad write a transposed copy).
//
// Numbers: the same FP8 values as the bf16-held path (core/fp8.h's
// rounding, bit for bit), products exact, and cuBLASLt applies alpha *
// (1/sb) * (1/sa) in its own order. Hopper's FP8 tensor cores keep fewer
// accumulator bits between cuBLASLt's promotions to fp32 (about 14 by
// DeepSeek-V3's report), so sums may be off by about 2^-13 of sum |a8 b8|,
// beyond the fp32 bound of core/ops/fp8_gemm.h: fp8_test allows 2^-11
// for this route. Not yet run on a GPU.
#ifndef CORE_OPS_CUDA_FP8_LT_GEMM_H_
#define CORE_OPS_CUDA_FP8_LT_GEMM_H_

#include <cublasLt.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/fp8.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {
namespace cuda {

// Runs the GEMM through cuBLASLt's FP8 matmul. Unimplemented (nothing
// launched) when the device, the shapes or the formats are not a case it
// takes, or its heuristic has no algorithm: the caller then runs the
// bf16-held path. Arguments as Fp8Gemm's, validated.
absl::Status Fp8GemmCublasLt(const Tensor& a, bool trans_a, Fp8Format a_format,
                             const Tensor& a_scale, const Tensor& b,
                             bool trans_b, Fp8Format b_format,
                             const Tensor& b_scale, Tensor* c, float alpha,
                             float beta);

namespace internal {

// cuBLASLt's arguments for one call, in its column-major terms (the first
// operand op T, the second op N; see the top of this file).
struct Fp8LtArgs {
  int64_t m = 0, n = 0, k = 0;  // c^T is m x n (m = N, n = M), inner k = K.
  int64_t ld_first = 0, ld_second = 0, ldc = 0;
  cudaDataType_t first_type{}, second_type{}, c_type{};
  // Whether b's FP8 copy (the first operand, row-major [N, K]) is written
  // transposed from b's [K, N], and a's (the second, [M, K]) from a's
  // [K, M].
  bool transpose_b = false, transpose_a = false;
};

// The arguments for row-major c [M, N] = op(a) op(b) (shapes of a and b as
// stored, 2-D); Unimplemented, naming the reason, for what the FP8 matmul
// does not take: both formats E5M2, K or N not a multiple of 16 (the FP8
// operands' and C's leading dimensions must be 16-byte multiples), or a
// dimension beyond int32.
absl::StatusOr<Fp8LtArgs> Fp8LtGemmArgs(const Shape& a, bool trans_a,
                                        Fp8Format a_format, const Shape& b,
                                        bool trans_b, Fp8Format b_format,
                                        DType c_dtype);

// For tests: 0 runs every Fp8Gemm on the bf16-held path, 1 through
// cuBLASLt where it takes the case (the default). Returns the previous
// setting.
int SetFp8CublasLtForTesting(int use);

}  // namespace internal

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FP8_LT_GEMM_H_
