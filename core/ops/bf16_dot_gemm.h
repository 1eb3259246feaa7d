#ifndef CORE_OPS_BF16_DOT_GEMM_H_
#define CORE_OPS_BF16_DOT_GEMM_H_

// Small bf16 block products through the AVX512-BF16 dot-product instruction
// (vdpbf16ps), for kernels that tile their own problem (flash attention).
// Each step adds the products of two bf16 pairs to an fp32 lane; a product
// of two bf16 values is exact in fp32 (8 x 8 significand bits), so the only
// rounding is fp32 accumulation, as in an fp32 GEMM of the same inputs. The
// instruction treats subnormal inputs and results as zero (|x| < 2^-126).
//
// Callers check CpuSupportsAvx512Bf16() (core/ops/cpu_isa.h) first.

#include <cstdint>

#include "core/half.h"

namespace mcc {
namespace ops {

// C[m x n] (= or +=) A[m x k] * B[k x n] with k even, fp32 C (row stride
// ldc). A is row-major: A(i, p) = a[i * lda + p] (lda even). B is in pair
// ("VNNI") layout: B(p, j) = b[(p / 2) * ldb + 2 * j + p % 2], so one 32-bit
// word holds rows p and p + 1 of a column (ldb even, at least 2 * n).
void Bf16DotGemm(int64_t m, int64_t n, int64_t k, const BFloat16* a,
                 int64_t lda, const BFloat16* b, int64_t ldb, float* c,
                 int64_t ldc, bool accumulate);

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_BF16_DOT_GEMM_H_
