#ifndef CORE_OPS_GROUPED_GEMM_H_
#define CORE_OPS_GROUPED_GEMM_H_

// Matrix products over groups of rows of different sizes, one weight
// matrix per group: the experts of a mixture-of-experts layer, whose rows
// are the tokens MoeSortTokens (core/ops/moe_permute.h) grouped by expert.
//
//   x  [M, K]  rows of group g: [sum_{g' < g} m_g', sum_{g' <= g} m_g'),
//              with group_sizes m_0 ... m_{G-1} summing to M
//   w  [G, K, N], or [G, N, K] with trans_w (a Linear layer's [out, in])
//   y  [M, N]  y_g = x_g op(w_g)
// Backward: dx = GroupedGemm(dy, w, !trans_w) (dx_g = dy_g op(w_g)^T), and
// GroupedGemmWeightGrad for dw_g = x_g^T dy_g (or dy_g^T x_g with trans_w).
//
// group_sizes live on the host: the CPU kernel makes one GEMM per non-empty
// group through ops::Gemm (core/ops/gemm.h: oneDNN, fp32 accumulation; bf16
// and fp16 operands as Gemm takes them), so a device run copies the token
// counts to the host once per layer, as Megatron does for its all-to-all
// splits. x and w share one dtype (fp32, bf16 or fp16); y is fp32 or that
// dtype (a 16-bit y is computed in fp32 and rounded once); dw is fp32.
// Arguments are validated before anything is written; each op runs its
// slot's kernel (core/ops/dispatch.h).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// y = x op(w) per group, overwritten (beta == 0, never read) or
// accumulated (y = x op(w) + beta * y).
absl::Status GroupedGemm(const Tensor& x, const Tensor& w, bool trans_w,
                         absl::Span<const int64_t> group_sizes, Tensor* y,
                         float beta = 0.0f);

// dw [G, K, N] (or [G, N, K] with trans_w), fp32: dw_g = x_g^T dy_g (or
// dy_g^T x_g) + beta * dw_g; beta = 1 accumulates gradients (a group with
// no rows then keeps its dw_g; with beta = 0 it is zeroed).
absl::Status GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy,
                                   bool trans_w,
                                   absl::Span<const int64_t> group_sizes,
                                   Tensor* dw, float beta = 1.0f);

// Kernels (core/ops/dispatch.h), with the ops' signatures.
using GroupedGemmKernel = absl::Status (*)(const Tensor& x, const Tensor& w,
                                           bool trans_w,
                                           absl::Span<const int64_t> sizes,
                                           Tensor* y, float beta);
using GroupedGemmWeightGradKernel =
    absl::Status (*)(const Tensor& x, const Tensor& dy, bool trans_w,
                     absl::Span<const int64_t> sizes, Tensor* dw, float beta);
KernelSlot<GroupedGemmKernel>& GroupedGemmKernels();
KernelSlot<GroupedGemmWeightGradKernel>& GroupedGemmWeightGradKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_GROUPED_GEMM_H_
