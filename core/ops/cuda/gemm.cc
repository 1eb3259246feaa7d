#include "core/ops/cuda/gemm.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/ops/cuda/elementwise.h"
#include "core/ops/cuda/launch.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr int64_t kIntMax = 2147483647;

cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// Whether cublasGemmEx with CUBLAS_COMPUTE_32F takes operands of `in` and a
// C of `out` directly: fp32 -> fp32, and 16-bit operands -> their own type
// or fp32. Other outputs go through an fp32 staging C.
bool DirectOutput(DType in, DType out) {
  return out == DType::kFloat32 ? true : in == out;
}

absl::Status RunGemm(const char* op, const Tensor& a, bool trans_a,
                     const Tensor& b, bool trans_b, Tensor* c, float alpha,
                     float beta, bool batched) {
  const int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t n = trans_b ? b.size(-2) : b.size(-1);
  const int64_t batch = batched ? c->size(0) : 1;
  const bool b_shared = batched && b.dim() == 2;
  KernelScope scope(op, *c);
  MCC_RETURN_IF_ERROR(scope.status());
  if (m > kIntMax || n > kIntMax || k > kIntMax || batch > kIntMax) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dimensions exceed cuBLAS's int32 (m ", m, ", n ", n,
                     ", k ", k, ", batch ", batch, ")"));
  }
  if (m == 0 || n == 0 || batch == 0) return absl::OkStatus();
  const cudaStream_t stream = scope.stream();
  if (k == 0) {
    // The product is empty: c = beta * c, and zeros without reading c when
    // beta == 0 (cuBLAS may leave c untouched for k == 0).
    if (beta == 0.0f) {
      return scope.Check(
          cudaMemsetAsync(c->raw_data(), 0, c->nbytes(), stream));
    }
    const cuda_kernels::ElemType ct = ElemTypeOf(*c);
    return scope.Check(cuda_kernels::Scale(
        c->raw_data(), ct, beta, c->raw_data(), ct, c->numel(), stream));
  }

  // A C type that cuBLAS cannot write from these operands is staged in fp32
  // (the CPU kernel's own route: compute in fp32, round once). The staging
  // buffer returns to the caching allocator at once; work later in this
  // stream's order may reuse it safely.
  Tensor out = *c;
  if (!DirectOutput(a.dtype(), c->dtype())) {
    out = Tensor::Empty(c->shape(), DType::kFloat32, c->device());
    if (beta != 0.0f) {
      MCC_RETURN_IF_ERROR(scope.Check(cuda_kernels::Convert(
          c->raw_data(), ElemTypeOf(*c), out.raw_data(),
          cuda_kernels::ElemType::kF32, c->numel(), stream)));
    }
  }
  MCC_ASSIGN_OR_RETURN(cublasHandle_t handle, CublasHandle(c->device().index));

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so the
  // column-major call takes B first with the row-major leading dimensions.
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int cm = static_cast<int>(n), cn = static_cast<int>(m),
            ck = static_cast<int>(k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldc = static_cast<int>(n);
  const cudaDataType_t in_type = CudaType(a.dtype());
  const cudaDataType_t out_type = CudaType(out.dtype());
  if (!batched) {
    MCC_RETURN_IF_ERROR(CublasToStatus(
        cublasGemmEx(handle, op_b, op_a, cm, cn, ck, &alpha, b.raw_data(),
                     in_type, ldb, a.raw_data(), in_type, lda, &beta,
                     out.raw_data(), out_type, ldc, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx"));
  } else {
    // A shared b is batch stride 0: every entry reads the same matrix.
    const long long stride_a = m * k, stride_b = b_shared ? 0 : k * n,
                    stride_c = m * n;
    MCC_RETURN_IF_ERROR(CublasToStatus(
        cublasGemmStridedBatchedEx(
            handle, op_b, op_a, cm, cn, ck, &alpha, b.raw_data(), in_type, ldb,
            stride_b, a.raw_data(), in_type, lda, stride_a, &beta,
            out.raw_data(), out_type, ldc, stride_c, static_cast<int>(batch),
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx"));
  }
  if (out.raw_data() != c->raw_data()) {
    return scope.Check(cuda_kernels::Convert(
        out.raw_data(), cuda_kernels::ElemType::kF32, c->raw_data(),
        ElemTypeOf(*c), c->numel(), stream));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CublasToStatus(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, " failed: ", cublasGetStatusString(status)));
}

absl::StatusOr<cublasHandle_t> CublasHandle(int device) {
  MCC_RETURN_IF_ERROR(::mcc::cuda::CheckDeviceIndex(device));
  if (device >= kMaxDevices) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuBLAS: device index ", device, " beyond ", kMaxDevices));
  }
  // Never destroyed: destroying at thread or process exit can race the
  // driver's own teardown.
  thread_local cublasHandle_t handles[kMaxDevices] = {};
  cublasHandle_t& handle = handles[device];
  ::mcc::cuda::DeviceGuard guard(device);
  if (handle == nullptr) {
    MCC_RETURN_IF_ERROR(CublasToStatus(cublasCreate(&handle), "cublasCreate"));
  }
  MCC_RETURN_IF_ERROR(CublasToStatus(
      cublasSetStream(handle, ::mcc::cuda::CurrentStream(device)),
      "cublasSetStream"));
  return handle;
}

absl::Status GemmCuda(const Tensor& a, bool trans_a, const Tensor& b,
                      bool trans_b, Tensor* c, float alpha, float beta) {
  return RunGemm("Gemm", a, trans_a, b, trans_b, c, alpha, beta,
                 /*batched=*/false);
}

absl::Status BatchedGemmCuda(const Tensor& a, bool trans_a, const Tensor& b,
                             bool trans_b, Tensor* c, float alpha, float beta) {
  return RunGemm("BatchedGemm", a, trans_a, b, trans_b, c, alpha, beta,
                 /*batched=*/true);
}

}  // namespace cuda
}  // namespace ops
}  // namespace mcc
