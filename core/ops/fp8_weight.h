#ifndef CORE_OPS_FP8_WEIGHT_H_
#define CORE_OPS_FP8_WEIGHT_H_

// Weight-only FP8 for inference (issue 43's --quantize fp8): a linear
// layer's weight w [N, K] held as E4M3 codes (one byte each: half of bf16)
// with fp32 scales, per output channel or one per tensor, beside the int8
// path (core/ops/int8_quantize.h, int8_gemm.h).
//
//   s[n] = 448 / absmax[n] (1 for absmax 0), codes[n, k] = e4m3(w[n, k] *
//   s[n]), with w * s an fp32 product rounded to nearest even (core/fp8.h).
// The caller gives absmax: per output channel, the row maxima (ops::RowAbsMax,
// core/ops/int8_quantize.h, reduced over the ranks that hold other columns
// of the rows); per tensor, the whole weight's maximum in every entry
// (reduced over the ranks that hold other rows too). FP8WeightAbsMax below
// gives the single-rank values. The largest magnitude lands on 448 exactly,
// so nothing saturates.
//
// The GEMM: y[m, n] = (1/s[n]) * sum_k x[m, k] * e4m3(codes[n, k]), the
// codes decoded exactly to fp32, the sum in fp32 (unspecified order), 1/s[n]
// an fp32 reciprocal applied once, a bf16 y rounded once at the end; so
//   |y - (1/s) sum x c| <= (gamma_K + 2u) (1/s) sum |x c|  (+ 2^-8 |y| bf16).
// On the CPU the activations stay in their precision (weight-only, as the
// int8 path); cuBLASLt's FP8 GEMM on sm_90 would also cast them to FP8.
//
// There is no FP8 dtype: codes live in an int8 tensor holding the E4M3 bit
// patterns (the same bytes a CUDA __nv_fp8_e4m3 array would hold).

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

enum class Fp8WeightScaling { kPerChannel, kPerTensor };
// "per-channel" or "per-tensor".
const char* Fp8WeightScalingName(Fp8WeightScaling scaling);

// w: 2-D fp32, bf16 or fp16 [N, K]; absmax: fp32 [N], each at least its
// row's own maximum (else an error naming the row); codes: int8 [N, K];
// scales: fp32 [N]; both overwritten. Errors (nothing written) name the
// tensor at fault.
absl::Status QuantizeWeightFp8(const Tensor& w, const Tensor& absmax,
                               Tensor* codes, Tensor* scales);

// absmax [N] for a whole weight on one rank: the row maxima (per channel),
// or their maximum in every entry (per tensor). Synchronises with the host
// (per tensor).
absl::Status Fp8WeightAbsMax(const Tensor& w, Fp8WeightScaling scaling,
                             Tensor* absmax);

// x: [M, K] fp32, bf16 or fp16; codes int8 [N, K]; scales fp32 [N]; y [M, N]
// fp32 or x's dtype, overwritten.
absl::Status Fp8WeightGemm(const Tensor& x, const Tensor& codes,
                           const Tensor& scales, Tensor* y);

// Kernels (core/ops/dispatch.h): arguments validated, outputs overwritten.
using QuantizeWeightFp8Kernel = absl::Status (*)(const Tensor& w,
                                                 const Tensor& absmax,
                                                 Tensor* codes, Tensor* scales);
KernelSlot<QuantizeWeightFp8Kernel>& QuantizeWeightFp8Kernels();
using Fp8WeightGemmKernel = absl::Status (*)(const Tensor& x,
                                             const Tensor& codes,
                                             const Tensor& scales, Tensor* y);
KernelSlot<Fp8WeightGemmKernel>& Fp8WeightGemmKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_FP8_WEIGHT_H_
