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
// ldc). A is read in 32-bit words of two bf16 values: A(i, p) and A(i, p + 1)
// for even p are word (i * a_row + (p / 2) * a_pair) of a, so a row-major A
// with row stride lda has a_row = lda / 2 and a_pair = 1, and a transposed
// one stored in pair layout (below) has a_row = 1. B is in pair ("VNNI")
// layout: B(p, j) = b[(p / 2) * ldb + 2 * j + p % 2], so one word holds rows
// p and p + 1 of a column (ldb even, at least 2 * n).
void Bf16DotGemm(int64_t m, int64_t n, int64_t k, const BFloat16* a,
                 int64_t a_row, int64_t a_pair, const BFloat16* b, int64_t ldb,
                 float* c, int64_t ldc, bool accumulate);

// fp32 [rows, cols] (row stride lds) rounded to nearest even bf16 (the
// instruction's conversion: subnormals become zero).
// Row-major: dst[r * ldd + c], with a zero column at c = cols when cols is
// odd (so the pairs of a k loop over the even count are complete).
void RoundToBf16Rows(const float* src, int64_t lds, int64_t rows, int64_t cols,
                     BFloat16* dst, int64_t ldd);
// Pair layout of the same matrix: dst[(r / 2) * ldd + 2 * c + r % 2], with a
// zero row at r = rows when rows is odd.
void RoundToBf16Pairs(const float* src, int64_t lds, int64_t rows, int64_t cols,
                      BFloat16* dst, int64_t ldd);

// bf16 rows [rows, d] (row stride `stride`) in pair layout:
// dst[(t / 2) * 2d + 2x + t % 2] = src[t * stride + x], with a zero row
// after an odd count. B of products over rows, or A of the transposed ones.
void PackBf16RowPairs(const BFloat16* src, int64_t stride, int64_t rows,
                      int64_t d, BFloat16* dst);

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_BF16_DOT_GEMM_H_
