#ifndef INFERENCE_ROW_GEMM_H_
#define INFERENCE_ROW_GEMM_H_

// A GEMM whose every output row is computed the same way whatever the number
// of rows: the inference engine batches the tokens of many requests into one
// matrix, and a request's output must not change with the company it keeps
// (tuned libraries pick kernels and blockings by the row count, which moves
// the float rounding).

#include <cstdint>

namespace mcc {
namespace inference {

// y[m, n] = sum_k x[m, k] * w[n, k] for row-major x [rows, k], w [cols, k]
// and y [rows, cols] (overwritten), all fp32 host memory. Each y[m, n] is
// reduced in one fixed order that depends only on k and the kernel ISA
// (ops::KernelIsa(): 16 AVX-512 lanes or 8 AVX2 lanes, chosen at run time),
// so on a machine row m's values are bit-identical for any `rows` and any
// other rows. Uses the global thread
// pool (core/thread_pool.h); safe to call from one thread at a time per
// pool loop (the pool's rule).
void RowGemm(const float* x, int64_t rows, int64_t k, const float* w,
             int64_t cols, float* y);

// The same for weight-only int8 (core/ops/int8_gemm.h's contract): w is
// q [cols, k] int8 with fp32 per-row scales [cols], and
// y[m, n] = scales[n] * sum_k x[m, k] * q[n, k], the sum in RowGemm's fixed
// order over q widened exactly to fp32, scaled once. Row m's values are
// bit-identical for any `rows`, as RowGemm's.
void RowGemmInt8(const float* x, int64_t rows, int64_t k, const int8_t* q,
                 const float* scales, int64_t cols, float* y);

// sum_i a[i] * b[i] in RowGemm's fixed order (one output of it).
float FixedOrderDot(const float* a, const float* b, int64_t n);

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_ROW_GEMM_H_
