#ifndef CORE_OPS_INT8_GEMM_H_
#define CORE_OPS_INT8_GEMM_H_

// Weight-only int8 matrix product: y = x * (diag(s) q)^T, i.e.
//   y[m, n] = s[n] * sum_k x[m, k] * q[n, k]
// with x [M, K] fp32 or bf16 activations, q [N, K] int8 weights and s [N]
// fp32 per-output-channel scales (core/ops/int8_quantize.h), y [M, N] in x's
// dtype (fp32 also allowed for a bf16 x).
//
// Numerics (every path): x and q are widened to fp32 exactly (|q| <= 127
// and bf16 are both exact in fp32), the K products are summed in fp32 in an
// unspecified order, the sum is multiplied by s[n] once, and a bf16 y is
// rounded once at the end. So, with u = 2^-24 and gamma_K = K u / (1 - K u),
//   |y - s sum x q| <= (gamma_K + u (1 + gamma_K)) s sum |x q|  (+ one bf16
//   rounding, 2^-8 |y|, for a bf16 y),
// the bound the tests check against a double-precision reference. No
// approximate instruction is used. The activations are not quantised, so
// the int8 dot-product instructions (VNNI) do not apply: they would need
// int8 activations, a different and less accurate contract.
//
// Paths, chosen at run time:
//   - direct: converts the weights in registers and accumulates with FMAs,
//     reading each weight byte once per tile of four x rows; AVX-512 or AVX2
//     as core/ops/cpu_isa.h chooses (MCC_CPU_ISA=avx2 caps it). The decode
//     shapes (small M) are memory-bound on the weights, which it reads at a
//     quarter of fp32's bytes.
//   - dequantised sgemm: converts panels of q to fp32 (exactly; s applied
//     after) and runs oneDNN's sgemm (core/ops/gemm.h); faster for large M
//     (prefill, loss evaluation), where the product is compute-bound.
//   - scalar: portable C++, the reference for ports and the tests.
// The direct path is taken for M <= kInt8DirectMaxRows, else the sgemm one.
// oneDNN's own int8 matmul (this project's oneDNN 2.6) requires int8
// activations, so it does not fit weight-only quantisation.
//
// Thread-safety: as every op (core/ops/dispatch.h); uses
// ThreadPool::Global() and oneDNN's threads.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// y = x (s q)^T as above; y is overwritten. Errors (nothing written) for
// shapes that do not fit, dtypes outside the contract, or mixed devices.
absl::Status Int8Gemm(const Tensor& x, const Tensor& q, const Tensor& scales,
                      Tensor* y);

// Raw CPU form on fp32 row-major arrays: x [m, k] (row stride ldx),
// q [n, k] (row stride k), scales [n], y [m, n] (row stride ldy).
enum class Int8GemmPath { kAuto, kScalar, kAvx2, kAvx512, kDequantSgemm };
const char* Int8GemmPathName(Int8GemmPath path);
void Int8GemmF32(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx,
                 const int8_t* q, const float* scales, float* y, int64_t ldy,
                 Int8GemmPath path = Int8GemmPath::kAuto);

// The largest M the automatic choice sends to the direct path: on the Zen 5
// dev box (docs/benchmarks/2026-12-01.md) it beat the dequantised sgemm at
// every M <= 64.
constexpr int64_t kInt8DirectMaxRows = 64;

// What kAuto runs for this M on this machine.
Int8GemmPath Int8GemmAutoPath(int64_t m);

// Kernel (core/ops/dispatch.h): arguments validated, y overwritten, on the
// device's current stream, no host synchronisation.
using Int8GemmKernel = absl::Status (*)(const Tensor& x, const Tensor& q,
                                        const Tensor& scales, Tensor* y);
KernelSlot<Int8GemmKernel>& Int8GemmKernels();

namespace internal {
// For tests and benchmarks: the path every later Int8Gemm call takes
// (kAuto restores the automatic choice); returns the previous setting. A
// path the CPU cannot run (kAvx512 without AVX-512) falls back to kAvx2.
Int8GemmPath SetInt8GemmPathForTesting(Int8GemmPath path);
}  // namespace internal

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_INT8_GEMM_H_
