// cuBLAS kernels of the Gemm and BatchedGemm slots (core/ops/gemm.h), with
// the CPU kernels' contract: row-major c = alpha * op(a) op(b) + beta * c, a
// and b both fp32, both bf16 or both fp16, c fp32, bf16 or fp16, fp32
// accumulation (CUBLAS_COMPUTE_32F: true fp32 for fp32 operands, no TF32),
// beta == 0 never reading c, a batched b of rank 2 shared by every entry.
// They run on the device's current stream (core/cuda/stream.h) and never
// synchronise. Linking //core/ops/cuda:registrations puts them in the slots;
// call ops::Gemm and ops::BatchedGemm, not these.
#ifndef CORE_OPS_CUDA_GEMM_H_
#define CORE_OPS_CUDA_GEMM_H_

#include <cublas_v2.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {
namespace cuda {

// The slot kernels (arguments validated by the ops).
absl::Status GemmCuda(const Tensor& a, bool trans_a, const Tensor& b,
                      bool trans_b, Tensor* c, float alpha, float beta);
absl::Status BatchedGemmCuda(const Tensor& a, bool trans_a, const Tensor& b,
                             bool trans_b, Tensor* c, float alpha, float beta);

// This thread's cuBLAS handle for a device, bound to its current stream
// (created on first use, kept for the thread's life). FailedPrecondition
// when the device does not exist.
absl::StatusOr<cublasHandle_t> CublasHandle(int device);

// OK, or an Internal error naming the call and cuBLAS's status string.
absl::Status CublasToStatus(cublasStatus_t status, const char* call);

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_GEMM_H_
