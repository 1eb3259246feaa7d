#ifndef CORE_OPS_FP8_GEMM_H_
#define CORE_OPS_FP8_GEMM_H_

// FP8 matrix product with per-tensor scales: the contract of
// TransformerEngine's FP8 GEMM and of cuBLASLt's with A/B scale pointers.
//
//   c = alpha * (1/sa) (1/sb) * op(A8) op(B8) + beta * c,
//   A8 = fp8_fa(a * sa), B8 = fp8_fb(b * sb),
//
// where a * sa is an fp32 product, fp8_f rounds it to the FP8 format f to
// nearest even, saturating (core/fp8.h), sa and sb are the fp32 scales
// (one element each, on the operands' device: the "scale pointers"), and
// 1/sa, 1/sb are fp32 reciprocals (TransformerEngine's scale_inv). The
// products of FP8 values are exact in fp32 and are summed in fp32 in an
// unspecified order; alpha (1/sa) (1/sb) is applied once to each sum, and a
// 16-bit c is rounded once at the end. So, with u = 2^-24 and
// gamma_K = K u / (1 - K u), against the exact sum over the same FP8
// values:  |c - exact| <= (gamma_K + 3u) |alpha/(sa sb)| sum |A8 B8|.
// One route is looser: cuBLASLt's native FP8 matmul on sm_89 and later
// (core/ops/cuda/fp8_lt_gemm.h) accumulates in Hopper's FP8 tensor cores,
// which keep about 14 bits between promotions to fp32, so there the bound
// is about 2^-13 |alpha/(sa sb)| sum |A8 B8| (fp8_test allows 2^-11).
//
// Taking high-precision operands (the cast happens inside the op) keeps one
// op per GEMM on every device: the CPU kernel emulates (rounds the operands
// to FP8 values held in fp32, then runs the fp32 GEMM, core/ops/gemm.h);
// a CUDA kernel casts to FP8 storage and runs cuBLASLt's FP8 matmul.
// The operands' layouts are those of ops::Gemm (row-major, op(X) = X or
// X^T), so a linear layer's three GEMMs (forward, input gradient, weight
// gradient accumulated into an fp32 main_grad with beta = 1) map one to one.
//
// Thread-safety: as every op (core/ops/dispatch.h).

#include "absl/status/status.h"
#include "core/fp8.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// a, b: 2-D fp32, bf16 or fp16 (they may differ); op(a) [m, k], op(b)
// [k, n]; a_scale, b_scale: fp32, one element each; c: [m, n] fp32, bf16 or
// fp16, overwritten (beta == 0: never read) or accumulated into. Every
// tensor on one device. Errors (nothing written) name the tensor at fault.
absl::Status Fp8Gemm(const Tensor& a, bool trans_a, Fp8Format a_format,
                     const Tensor& a_scale, const Tensor& b, bool trans_b,
                     Fp8Format b_format, const Tensor& b_scale, Tensor* c,
                     float alpha = 1.0f, float beta = 0.0f);

// Kernel (core/ops/dispatch.h): arguments validated; c as above, on the
// device's current stream, without host synchronisation.
using Fp8GemmKernel = absl::Status (*)(const Tensor& a, bool trans_a,
                                       Fp8Format a_format,
                                       const Tensor& a_scale, const Tensor& b,
                                       bool trans_b, Fp8Format b_format,
                                       const Tensor& b_scale, Tensor* c,
                                       float alpha, float beta);
KernelSlot<Fp8GemmKernel>& Fp8GemmKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_FP8_GEMM_H_
