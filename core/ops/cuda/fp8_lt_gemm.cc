#include "core/ops/cuda/fp8_lt_gemm.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/ops/cuda/cublas_library.h"
#include "core/ops/cuda/fp8.h"
#include "core/ops/cuda/gemm.h"
#include "core/ops/cuda/launch.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

namespace k = ::mcc::cuda_kernels;

constexpr int64_t kIntMax = 2147483647;
constexpr int kMaxDevices = 64;

std::atomic<int> g_use_lt{1};

cudaDataType_t Fp8Type(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// sm_89 and later have FP8 tensor cores (cached per device; -1 unknown).
bool HasFp8TensorCores(int device) {
  static std::atomic<int> known[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return false;
  int v = known[device].load();
  if (v == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                               device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                               device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    v = major * 10 + minor >= 89 ? 1 : -1;
    known[device].store(v);
  }
  return v > 0;
}

absl::Status Lt(cublasStatus_t status, const char* call) {
  return CublasToStatus(status, call);
}

// The descriptors of one call (destroyed with it).
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) Cublas().cublasLtMatmulPreferenceDestroy(pref);
    if (c) Cublas().cublasLtMatrixLayoutDestroy(c);
    if (second) Cublas().cublasLtMatrixLayoutDestroy(second);
    if (first) Cublas().cublasLtMatrixLayoutDestroy(first);
    if (op) Cublas().cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

namespace internal {

absl::StatusOr<Fp8LtArgs> Fp8LtGemmArgs(const Shape& a, bool trans_a,
                                        Fp8Format a_format, const Shape& b,
                                        bool trans_b, Fp8Format b_format,
                                        DType c_dtype) {
  if (a.size() != 2 || b.size() != 2) {
    return absl::UnimplementedError("the FP8 matmul takes 2-D operands");
  }
  const int64_t rows = trans_a ? a[1] : a[0];   // M
  const int64_t inner = trans_a ? a[0] : a[1];  // K
  const int64_t cols = trans_b ? b[0] : b[1];   // N
  if (a_format == Fp8Format::kE5M2 && b_format == Fp8Format::kE5M2) {
    return absl::UnimplementedError(
        "cuBLASLt's FP8 matmul takes no E5M2 x E5M2 product");
  }
  if (inner % 16 != 0 || cols % 16 != 0) {
    return absl::UnimplementedError(
        absl::StrCat("the FP8 matmul needs K and N multiples of 16, got K ",
                     inner, ", N ", cols));
  }
  if (rows > kIntMax || inner > kIntMax || cols > kIntMax) {
    return absl::UnimplementedError("a dimension exceeds int32");
  }
  Fp8LtArgs args;
  args.m = cols;
  args.n = rows;
  args.k = inner;
  args.ld_first = inner;
  args.ld_second = inner;
  args.ldc = cols;
  args.first_type = Fp8Type(b_format);
  args.second_type = Fp8Type(a_format);
  args.c_type = CudaDataTypeOf(c_dtype);
  args.transpose_b = !trans_b;
  args.transpose_a = trans_a;
  return args;
}

int SetFp8CublasLtForTesting(int use) { return g_use_lt.exchange(use); }

}  // namespace internal

absl::Status Fp8GemmCublasLt(const Tensor& a, bool trans_a, Fp8Format a_format,
                             const Tensor& a_scale, const Tensor& b,
                             bool trans_b, Fp8Format b_format,
                             const Tensor& b_scale, Tensor* c, float alpha,
                             float beta) {
  if (g_use_lt.load() == 0) {
    return absl::UnimplementedError("the FP8 matmul is off (a test)");
  }
  MCC_ASSIGN_OR_RETURN(
      const internal::Fp8LtArgs args,
      internal::Fp8LtGemmArgs(a.shape(), trans_a, a_format, b.shape(), trans_b,
                              b_format, c->dtype()));
  KernelScope s("Fp8Gemm", a);
  MCC_RETURN_IF_ERROR(s.status());
  if (!HasFp8TensorCores(s.device())) {
    return absl::UnimplementedError("no FP8 tensor cores (before sm_89)");
  }
  if (args.k == 0 || args.m == 0 || args.n == 0) {
    return absl::UnimplementedError("an empty product");
  }
  // The plan first, so that a case without an algorithm launches nothing.
  Descriptors d;
  MCC_RETURN_IF_ERROR(Lt(
      Cublas().cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
      "cublasLtMatmulDescCreate"));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  MCC_RETURN_IF_ERROR(
      Lt(Cublas().cublasLtMatmulDescSetAttribute(
             d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)),
         "cublasLtMatmulDescSetAttribute(TRANSA)"));
  MCC_RETURN_IF_ERROR(
      Lt(Cublas().cublasLtMatmulDescSetAttribute(
             d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)),
         "cublasLtMatmulDescSetAttribute(TRANSB)"));
  // The first operand (op T) is stored k x m, the second k x n.
  MCC_RETURN_IF_ERROR(
      Lt(Cublas().cublasLtMatrixLayoutCreate(&d.first, args.first_type, args.k,
                                             args.m, args.ld_first),
         "cublasLtMatrixLayoutCreate(A)"));
  MCC_RETURN_IF_ERROR(
      Lt(Cublas().cublasLtMatrixLayoutCreate(&d.second, args.second_type,
                                             args.k, args.n, args.ld_second),
         "cublasLtMatrixLayoutCreate(B)"));
  MCC_RETURN_IF_ERROR(Lt(Cublas().cublasLtMatrixLayoutCreate(
                             &d.c, args.c_type, args.m, args.n, args.ldc),
                         "cublasLtMatrixLayoutCreate(C)"));
  // Scale pointers: set before the heuristic (they select FP8 kernels);
  // the addresses are bound below, once the scratch exists.
  Tensor inverses = Tensor::Empty({2}, DType::kFloat32, a.device());
  float* inv = static_cast<float*>(inverses.raw_data());
  const float* first_scale = inv;       // 1 / sb: b is the first operand.
  const float* second_scale = inv + 1;  // 1 / sa
  MCC_RETURN_IF_ERROR(Lt(Cublas().cublasLtMatmulDescSetAttribute(
                             d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                             &first_scale, sizeof(first_scale)),
                         "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)"));
  MCC_RETURN_IF_ERROR(Lt(Cublas().cublasLtMatmulDescSetAttribute(
                             d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                             &second_scale, sizeof(second_scale)),
                         "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)"));
  MCC_RETURN_IF_ERROR(Lt(Cublas().cublasLtMatmulPreferenceCreate(&d.pref),
                         "cublasLtMatmulPreferenceCreate"));
  const uint64_t max_workspace = kCublasLtWorkspaceBytes;
  MCC_RETURN_IF_ERROR(Lt(Cublas().cublasLtMatmulPreferenceSetAttribute(
                             d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                             &max_workspace, sizeof(max_workspace)),
                         "cublasLtMatmulPreferenceSetAttribute"));
  MCC_ASSIGN_OR_RETURN(cublasLtHandle_t handle, CublasLtHandle(s.device()));
  cublasLtMatmulHeuristicResult_t result = {};
  int returned = 0;
  const cublasStatus_t st = Cublas().cublasLtMatmulAlgoGetHeuristic(
      handle, d.op, d.first, d.second, d.c, d.c, d.pref, 1, &result, &returned);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED ||
      (st == CUBLAS_STATUS_SUCCESS &&
       (returned == 0 || result.state != CUBLAS_STATUS_SUCCESS))) {
    return absl::UnimplementedError("cuBLASLt has no FP8 algorithm here");
  }
  MCC_RETURN_IF_ERROR(Lt(st, "cublasLtMatmulAlgoGetHeuristic"));

  // FP8 copies in the TN layout, and the dequantising scales.
  const int64_t m_rows = trans_a ? a.size(1) : a.size(0);
  Tensor first8 = Tensor::Empty({args.m, args.k}, DType::kInt8, a.device());
  Tensor second8 = Tensor::Empty({m_rows, args.k}, DType::kInt8, a.device());
  auto bytes = [](Tensor* t) { return static_cast<uint8_t*>(t->raw_data()); };
  MCC_RETURN_IF_ERROR(s.Check(
      k::CastToFp8Bytes(b.raw_data(), ElemTypeOf(b),
                        static_cast<const float*>(b_scale.raw_data()),
                        b_format == Fp8Format::kE5M2, bytes(&first8), b.size(0),
                        b.size(1), args.transpose_b, s.stream())));
  MCC_RETURN_IF_ERROR(s.Check(
      k::CastToFp8Bytes(a.raw_data(), ElemTypeOf(a),
                        static_cast<const float*>(a_scale.raw_data()),
                        a_format == Fp8Format::kE5M2, bytes(&second8),
                        a.size(0), a.size(1), args.transpose_a, s.stream())));
  MCC_RETURN_IF_ERROR(s.Check(k::Fp8ScaleInverses(
      static_cast<const float*>(b_scale.raw_data()),
      static_cast<const float*>(a_scale.raw_data()), inv, s.stream())));
  Tensor workspace;
  if (result.workspaceSize > 0) {
    workspace = Tensor::Empty({static_cast<int64_t>(result.workspaceSize)},
                              DType::kInt8, a.device());
  }
  return Lt(
      Cublas().cublasLtMatmul(
          handle, d.op, &alpha, first8.raw_data(), d.first, second8.raw_data(),
          d.second, &beta, c->raw_data(), d.c, c->raw_data(), d.c, &result.algo,
          result.workspaceSize > 0 ? workspace.raw_data() : nullptr,
          result.workspaceSize, s.stream()),
      "cublasLtMatmul");
}

}  // namespace cuda
}  // namespace ops
}  // namespace mcc
