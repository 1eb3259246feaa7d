// cuBLAS GEMMs for CUDA tensors, row-major:
//   C = alpha * op(A) * op(B) + beta * C
// A is [M, K] ([K, M] when trans_a), B is [K, N] ([N, K] when trans_b), C is
// [M, N]; with a leading batch dimension on all three (equal sizes) the
// batched strided GEMM runs. Inputs fp32 -> C fp32 (true fp32 unless
// allow_tf32), or bf16 -> C bf16 or fp32; accumulation is fp32 throughout.
// Runs on the device's current stream (core/cuda/stream.h).
#ifndef CORE_OPS_CUDA_GEMM_H_
#define CORE_OPS_CUDA_GEMM_H_

#include <cublas_v2.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {
namespace cuda {

struct GemmOptions {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
  // TF32 tensor cores for fp32 inputs (faster, ~1e-3 relative error). Off by
  // default so results match fp32 references.
  bool allow_tf32 = false;
};

// Writes C in place (its contents are read when beta != 0).
absl::Status Gemm(const Tensor& a, const Tensor& b, Tensor& c,
                  const GemmOptions& options = {});

// A new C = alpha * op(A) op(B) of dtype out_dtype (default: A's dtype).
absl::StatusOr<Tensor> Matmul(const Tensor& a, const Tensor& b,
                              const GemmOptions& options = {},
                              std::optional<DType> out_dtype = std::nullopt);

// This thread's cuBLAS handle for a device, bound to its current stream
// (created on first use, kept for the thread's life).
absl::StatusOr<cublasHandle_t> CublasHandle(int device);

// OK, or an Internal error naming the call and cuBLAS's status string.
absl::Status CublasToStatus(cublasStatus_t status, const char* call);

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_GEMM_H_
