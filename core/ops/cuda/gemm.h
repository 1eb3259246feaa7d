// CUDA kernels of the Gemm and BatchedGemm slots (core/ops/gemm.h), with the
// CPU kernels' contract: row-major c = alpha * op(a) op(b) + beta * c, a and
// b both fp32, both bf16 or both fp16, c fp32, bf16 or fp16, fp32
// accumulation, beta == 0 never reading c, a batched b of rank 2 shared by
// every entry. Weight-gradient accumulation into an fp32 main_grad (bf16 or
// fp16 a and b, fp32 c, beta = 1) is one of these mixes and runs as one
// GEMM, without staging.
//
// Route: cuBLASLt (cublasLtMatmul with the heuristic's first algorithm,
// cached per shape, dtypes, transposes and operand alignment, up to 256
// plans a device, least recently used dropped first; a workspace
// of up to kCublasLtWorkspaceBytes from the caching allocator). When
// cuBLASLt finds no algorithm for a case, cublasGemmEx (or its strided
// batched form) runs it. A c dtype that neither takes from these operands
// (bf16 operands into an fp16 c, fp32 operands into a 16-bit c) is computed
// into an fp32 staging c and rounded once, as the CPU kernel does.
//
// Compute type CUBLAS_COMPUTE_32F: true fp32 for fp32 operands (no TF32)
// unless SetCudaGemmAllowTf32(true). 16-bit operands multiply exactly and
// accumulate in fp32 on tensor cores either way.
//
// No epilogue (bias, GELU) is fused: no op of the dispatch contract takes a
// GEMM and its bias together (BiasAdd and BiasGelu are separate ops), so
// there is nothing to hang one on yet.
//
// They run on the device's current stream (core/cuda/stream.h) and never
// synchronise. Linking //core/ops/cuda:registrations puts them in the slots;
// call ops::Gemm and ops::BatchedGemm, not these.
#ifndef CORE_OPS_CUDA_GEMM_H_
#define CORE_OPS_CUDA_GEMM_H_

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>

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

// Whether fp32 GEMMs may round their operands to TF32 on tensor cores
// (PyTorch's allow_tf32): faster, with 10-bit-mantissa products. Off by
// default: fp32 training parity with the CPU needs true fp32. Process-wide;
// returns the previous setting.
bool SetCudaGemmAllowTf32(bool allow);
bool CudaGemmAllowsTf32();

// The largest cuBLASLt workspace a GEMM asks for.
inline constexpr uint64_t kCublasLtWorkspaceBytes = uint64_t{32} << 20;

// How many GEMM calls (batched or not, k > 0) each route has run so far in
// this process.
struct CudaGemmRouteCounts {
  int64_t cublas_lt = 0;
  int64_t cublas_fallback = 0;
};
CudaGemmRouteCounts CudaGemmRoutes();

// This thread's cuBLAS handle for a device, bound to its current stream
// (created on first use, kept for the thread's life). FailedPrecondition
// when the device does not exist.
absl::StatusOr<cublasHandle_t> CublasHandle(int device);
// This thread's cuBLASLt handle for a device (the stream is passed per
// call).
absl::StatusOr<cublasLtHandle_t> CublasLtHandle(int device);

// A cuBLASLt plan: a matmul's descriptors and the algorithm chosen for
// them (found false: the heuristic had none). Owns the descriptors.
struct CublasLtPlan {
  bool found = false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo = {};
  size_t workspace = 0;

  CublasLtPlan() = default;
  CublasLtPlan(const CublasLtPlan&) = delete;
  CublasLtPlan& operator=(const CublasLtPlan&) = delete;
  ~CublasLtPlan();
  // Destroys the descriptors: found false, nothing held.
  void Release();
};

// cuBLASLt's first (best) algorithm for a matmul's descriptors (C's layout
// also D's), with a workspace of up to max_workspace bytes and the
// operands' address alignments (LtAlignmentOf; 256 = cuBLASLt's default).
// found == false when it has none (the route falls back); an error for any
// other failure. Shared by the GEMM and FP8 routes' plans.
struct CublasLtAlgorithm {
  bool found = false;
  cublasLtMatmulAlgo_t algo = {};
  size_t workspace = 0;
};
absl::StatusOr<CublasLtAlgorithm> CublasLtBestAlgorithm(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
    cublasLtMatrixLayout_t first, cublasLtMatrixLayout_t second,
    cublasLtMatrixLayout_t c, uint64_t max_workspace, uint32_t align_first,
    uint32_t align_second, uint32_t align_c);

// OK, or an Internal error naming the call and cuBLAS's status string.
absl::Status CublasToStatus(cublasStatus_t status, const char* call);

// cuBLAS's element type for a GEMM operand of `dtype`: bf16, fp16, else
// fp32 (shared by the GEMM, grouped GEMM and FP8 routes).
cudaDataType_t CudaDataTypeOf(DType dtype);

namespace internal {
// For tests: the route every later GEMM takes. kCublas skips cuBLASLt;
// kCublasLt makes a case that cuBLASLt cannot run an error instead of a
// fallback. Returns the previous setting.
enum class CudaGemmRoute { kAuto, kCublasLt, kCublas };
CudaGemmRoute SetCudaGemmRouteForTesting(CudaGemmRoute route);
}  // namespace internal

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_GEMM_H_
