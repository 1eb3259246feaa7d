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

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/fp8.h"
#include "core/ops/cuda/lt_plan_cache.h"
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

// Everything that determines the FP8 matmul's cuBLASLt plan (matmul
// descriptor, layouts, preference and the heuristic's algorithm) on one
// device: the plan is built once per key and cached (bounded, per device).
// A field that changes what cuBLASLt is asked must be here, in Tie(), and in
// fp8_lt_plan_key_test's list of fields.
struct Fp8LtPlanKey {
  int device = 0;
  int64_t m = 0, n = 0, k = 0;
  int64_t ld_first = 0, ld_second = 0, ldc = 0;
  cudaDataType_t first_type = CUDA_R_8F_E4M3, second_type = CUDA_R_8F_E4M3;
  cudaDataType_t c_type = CUDA_R_32F;  // C and D.
  cudaDataType_t scale_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasOperation_t op_first = CUBLAS_OP_T, op_second = CUBLAS_OP_N;
  // Per-tensor fp32 scales through A/B_SCALE_POINTER (the pointers are
  // bound per call; whether they are set is part of the plan).
  cublasLtMatmulMatrixScale_t first_scale_mode =
      CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  cublasLtMatmulMatrixScale_t second_scale_mode =
      CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  uint64_t max_workspace = 0;
  // C's (and D's) address alignment (LtAlignmentOf); the FP8 copies are
  // fresh allocations, aligned as the allocator aligns.
  uint32_t c_alignment = 256;

  auto Tie() const {
    return std::make_tuple(
        device, m, n, k, ld_first, ld_second, ldc, first_type, second_type,
        c_type, scale_type, compute, op_first, op_second, first_scale_mode,
        second_scale_mode, epilogue, max_workspace, c_alignment);
  }
  bool operator==(const Fp8LtPlanKey& o) const { return Tie() == o.Tie(); }
  bool operator!=(const Fp8LtPlanKey& o) const { return !(*this == o); }
  template <typename H>
  friend H AbslHashValue(H h, const Fp8LtPlanKey& key) {
    return H::combine(std::move(h), key.Tie());
  }
};

// The key of one call: its arguments on `device`, C at `c_alignment`, with
// the route's fixed choices (TN, fp32 compute and scales, per-tensor scale
// pointers, no epilogue, a workspace of up to kCublasLtWorkspaceBytes).
Fp8LtPlanKey Fp8LtPlanKeyOf(const Fp8LtArgs& args, int device,
                            uint32_t c_alignment);

// Plans held per device.
inline constexpr size_t kFp8LtPlansPerDevice = 256;

// How `device`'s plan cache has been used (all zero for a device index
// outside [0, 64)).
LtPlanCacheCounts Fp8LtPlanCacheCounts(int device);

// For tests: 0 runs every Fp8Gemm on the bf16-held path, 1 through
// cuBLASLt where it takes the case (the default). Returns the previous
// setting.
int SetFp8CublasLtForTesting(int use);

}  // namespace internal

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FP8_LT_GEMM_H_
