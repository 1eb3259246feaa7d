#include "core/ops/cuda/gemm.h"

#include <cuda_runtime.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr absl::string_view kOp = "Gemm";

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(kOp, ": ", what));
}

cudaDataType_t CudaType(DType dtype) {
  return dtype == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
}

struct GemmShape {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  bool batched = false;
};

std::string Operands(const Tensor& a, const Tensor& b, const GemmOptions& o) {
  return absl::StrCat("A ", a.Describe(), o.trans_a ? " (transposed)" : "",
                      ", B ", b.Describe(), o.trans_b ? " (transposed)" : "");
}

absl::StatusOr<GemmShape> InferShape(const Tensor& a, const Tensor& b,
                                     const GemmOptions& o) {
  for (const Tensor* t : {&a, &b}) {
    if (!t->defined()) return Invalid("undefined operand");
    if (!t->device().is_cuda()) {
      return Invalid(absl::StrCat("operands must be CUDA tensors, got ",
                                  Operands(a, b, o)));
    }
  }
  MCC_RETURN_IF_ERROR(::mcc::cuda::CheckDeviceIndex(a.device().index));
  if (a.device() != b.device()) {
    return Invalid(
        absl::StrCat("operands on different devices: ", Operands(a, b, o)));
  }
  if (a.dtype() != b.dtype() ||
      (a.dtype() != DType::kFloat32 && a.dtype() != DType::kBFloat16)) {
    return Invalid(absl::StrCat("A and B must both be fp32 or both bf16, got ",
                                Operands(a, b, o)));
  }
  if (a.dim() != b.dim() || (a.dim() != 2 && a.dim() != 3)) {
    return Invalid(absl::StrCat("A and B must both be 2-D or both 3-D, got ",
                                Operands(a, b, o)));
  }
  GemmShape s;
  s.batched = a.dim() == 3;
  if (s.batched) {
    if (a.size(0) != b.size(0)) {
      return Invalid(absl::StrCat("batch sizes differ: ", Operands(a, b, o)));
    }
    s.batch = a.size(0);
  }
  s.m = o.trans_a ? a.size(-1) : a.size(-2);
  s.k = o.trans_a ? a.size(-2) : a.size(-1);
  const int64_t kb = o.trans_b ? b.size(-1) : b.size(-2);
  s.n = o.trans_b ? b.size(-2) : b.size(-1);
  if (kb != s.k) {
    return Invalid(absl::StrCat("inner dimensions differ (", s.k, " vs ", kb,
                                "): ", Operands(a, b, o)));
  }
  constexpr int64_t kIntMax = 2147483647;
  if (s.m > kIntMax || s.n > kIntMax || s.k > kIntMax || s.batch > kIntMax) {
    return Invalid(
        absl::StrCat("dimensions exceed int32: ", Operands(a, b, o)));
  }
  return s;
}

Shape OutShape(const GemmShape& s) {
  if (s.batched) return {s.batch, s.m, s.n};
  return {s.m, s.n};
}

}  // namespace

absl::Status CublasToStatus(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, " failed: ", cublasGetStatusString(status)));
}

absl::StatusOr<cublasHandle_t> CublasHandle(int device) {
  MCC_RETURN_IF_ERROR(::mcc::cuda::CheckDeviceIndex(device));
  if (device >= kMaxDevices) return Invalid("device index too large");
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

absl::Status Gemm(const Tensor& a, const Tensor& b, Tensor& c,
                  const GemmOptions& o) {
  MCC_ASSIGN_OR_RETURN(const GemmShape s, InferShape(a, b, o));
  const Shape want = OutShape(s);
  const bool c_ok = c.defined() && c.device() == a.device() &&
                    c.shape() == want &&
                    (c.dtype() == a.dtype() || c.dtype() == DType::kFloat32);
  if (!c_ok) {
    return Invalid(absl::StrCat("C must be ", DTypeName(a.dtype()),
                                a.dtype() == DType::kBFloat16 ? " or fp32" : "",
                                ShapeToString(want), " on ",
                                a.device().ToString(), ", got ", c.Describe(),
                                " for ", Operands(a, b, o)));
  }
  if (s.m == 0 || s.n == 0 || s.batch == 0) return absl::OkStatus();
  const int device = a.device().index;
  MCC_ASSIGN_OR_RETURN(cublasHandle_t handle, CublasHandle(device));
  ::mcc::cuda::DeviceGuard guard(device);
  if (s.k == 0 && o.beta == 0.0f) {
    // cuBLAS may leave C untouched for k == 0; define it as zero.
    c.Zero();
    return absl::OkStatus();
  }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so the
  // column-major call takes B first with the row-major leading dimensions.
  const cublasOperation_t op_b = o.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = o.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(s.n), n = static_cast<int>(s.m),
            k = static_cast<int>(s.k);
  const int ldb = static_cast<int>(o.trans_b ? s.k : s.n);
  const int lda = static_cast<int>(o.trans_a ? s.m : s.k);
  const int ldc = static_cast<int>(s.n);
  const cublasComputeType_t compute =
      (a.dtype() == DType::kFloat32 && o.allow_tf32)
          ? CUBLAS_COMPUTE_32F_FAST_TF32
          : CUBLAS_COMPUTE_32F;
  const cudaDataType_t in_type = CudaType(a.dtype());
  const cudaDataType_t out_type = CudaType(c.dtype());
  if (!s.batched) {
    return CublasToStatus(
        cublasGemmEx(handle, op_b, op_a, m, n, k, &o.alpha, b.raw_data(),
                     in_type, ldb, a.raw_data(), in_type, lda, &o.beta,
                     c.raw_data(), out_type, ldc, compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  }
  const long long stride_a = s.m * s.k, stride_b = s.k * s.n,
                  stride_c = s.m * s.n;
  return CublasToStatus(
      cublasGemmStridedBatchedEx(
          handle, op_b, op_a, m, n, k, &o.alpha, b.raw_data(), in_type, ldb,
          stride_b, a.raw_data(), in_type, lda, stride_a, &o.beta, c.raw_data(),
          out_type, ldc, stride_c, static_cast<int>(s.batch), compute,
          CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
}

absl::StatusOr<Tensor> Matmul(const Tensor& a, const Tensor& b,
                              const GemmOptions& options,
                              std::optional<DType> out_dtype) {
  MCC_ASSIGN_OR_RETURN(const GemmShape s, InferShape(a, b, options));
  Tensor c =
      Tensor::Empty(OutShape(s), out_dtype.value_or(a.dtype()), a.device());
  GemmOptions o = options;
  o.beta = 0.0f;
  MCC_RETURN_IF_ERROR(Gemm(a, b, c, o));
  return c;
}

}  // namespace cuda
}  // namespace ops
}  // namespace mcc
