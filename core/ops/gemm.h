#ifndef CORE_OPS_GEMM_H_
#define CORE_OPS_GEMM_H_

// Matrix products on row-major matrices, through oneDNN on the CPU.
//
// Raw:     C = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T, with
//          op(A) m x k, op(B) k x n, C m x n and leading dimensions (row
//          strides) lda, ldb, ldc as stored. beta == 0 never reads C (NaNs in
//          C do not propagate).
// Tensor:  the same on 2-D (Gemm) or 3-D (BatchedGemm) tensors, with every
//          argument checked before anything is written.
//
// bf16 inputs accumulate in fp32. Where the CPU has AVX512-BF16 or AMX,
// oneDNN's bf16 matmul runs natively; elsewhere (AVX2 machines) the inputs
// are widened to fp32 (vectorised) and the fp32 GEMM runs. Bf16GemmPath()
// says which, and the first bf16 GEMM logs it. oneDNN's OpenMP threads follow
// ThreadPool::Global().num_threads(). fp16 inputs are always widened to fp32
// (F16C) and run the fp32 GEMM.

#include <cstdint>

#include "absl/status/status.h"
#include "core/half.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

void GemmF32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc);

void GemmBF16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
              float alpha, const BFloat16* a, int64_t lda, const BFloat16* b,
              int64_t ldb, float beta, float* c, int64_t ldc);

// fp16 operands, widened to fp32 in panels; fp32 accumulation and output.
void GemmF16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const Float16* a, int64_t lda, const Float16* b,
             int64_t ldb, float beta, float* c, int64_t ldc);

enum class GemmPath {
  kConvertToF32,  // bf16 widened to fp32, fp32 GEMM (no native bf16 on CPU).
  kNativeBF16,    // oneDNN bf16 matmul (AVX512-BF16 / AMX).
};
GemmPath Bf16GemmPath();
const char* GemmPathName(GemmPath path);

// c = alpha * op(a) * op(b) + beta * c for 2-D tensors: op(a) [m, k],
// op(b) [k, n], c [m, n]. a and b are both fp32, both bf16 or both fp16; c
// is fp32, bf16 or fp16 (a 16-bit c is computed in fp32 and rounded once).
// Parameter-gradient accumulation (Megatron's gradient-accumulation fusion) is
// beta = 1 into an fp32 c, e.g. dW += dY^T X: Gemm(dy, true, x, false, &dw, 1,
// 1).
absl::Status Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                  Tensor* c, float alpha = 1.0f, float beta = 0.0f);

// Per batch entry: a [batch, ., .], b [batch, ., .] or a 2-D b shared by
// every entry, c [batch, m, n]. Dtype rules as Gemm.
absl::Status BatchedGemm(const Tensor& a, bool trans_a, const Tensor& b,
                         bool trans_b, Tensor* c, float alpha = 1.0f,
                         float beta = 0.0f);

// Device kernels (called after validation with the same arguments).
using GemmKernel = absl::Status (*)(const Tensor& a, bool trans_a,
                                    const Tensor& b, bool trans_b, Tensor* c,
                                    float alpha, float beta);
KernelSlot<GemmKernel>& GemmKernels();
KernelSlot<GemmKernel>& BatchedGemmKernels();

namespace internal {
// For tests: force the oneDNN matmul-primitive path (normally only taken for
// native bf16) for fp32 too, so its strides, alpha and beta are checked on
// machines without AVX512-BF16. Returns the previous setting.
bool SetForceMatmulPrimitiveForTesting(bool force);
// Primitives created so far by the matmul-primitive path (cache misses).
int64_t MatmulPrimitivesCreated();
// For tests: the widening path converts bf16 operands in panels of at most
// this many elements (default 4M); returns the previous value.
int64_t SetBf16WidenPanelForTesting(int64_t elements);
}  // namespace internal

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_GEMM_H_
