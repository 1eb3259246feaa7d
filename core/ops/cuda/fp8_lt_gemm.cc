#include "core/ops/cuda/fp8_lt_gemm.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/cuda/cublas_library.h"
#include "core/ops/cuda/fp8.h"
#include "core/ops/cuda/gemm.h"
#include "core/ops/cuda/launch.h"
#include "core/ops/cuda/lt_plan_cache.h"
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

// One key's plan: descriptors and the heuristic's algorithm (found false:
// it had none, so the call falls back without asking again). Released with
// the last holder (the cache may evict it while a call still launches).
struct Fp8LtPlan : CublasLtPlan {
  // The scale pointers are the one per-call attribute of `op`: a call sets
  // them and launches under this lock (cublasLtMatmul reads the descriptor
  // before it returns).
  std::mutex launch_mu;
};

// The plans of one device index, in [0, kMaxDevices); null beyond.
LtPlanCache<internal::Fp8LtPlanKey, Fp8LtPlan>* PlanCacheOf(int device) {
  static auto* caches =
      new PerDeviceLtPlanCaches<internal::Fp8LtPlanKey, Fp8LtPlan>(
          kMaxDevices, internal::kFp8LtPlansPerDevice);
  return caches->Of(device);
}

absl::Status SetScalePointers(cublasLtMatmulDesc_t op, const float* first,
                              const float* second) {
  MCC_RETURN_IF_ERROR(
      Lt(Cublas().cublasLtMatmulDescSetAttribute(
             op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &first, sizeof(first)),
         "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)"));
  return Lt(
      Cublas().cublasLtMatmulDescSetAttribute(
          op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &second, sizeof(second)),
      "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
}

// Builds the descriptors of `key` and asks the heuristic for its best
// algorithm, with the scale pointers bound to `first_scale` and
// `second_scale` (they select FP8 kernels; each call binds its own).
absl::StatusOr<std::unique_ptr<Fp8LtPlan>> MakePlan(
    cublasLtHandle_t handle, const internal::Fp8LtPlanKey& key,
    const float* first_scale, const float* second_scale) {
  auto plan = std::make_unique<Fp8LtPlan>();
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value,
                 const char* call) {
    return Lt(Cublas().cublasLtMatmulDescSetAttribute(plan->op, attr, &value,
                                                      sizeof(value)),
              call);
  };
  MCC_RETURN_IF_ERROR(Lt(
      Cublas().cublasLtMatmulDescCreate(&plan->op, key.compute, key.scale_type),
      "cublasLtMatmulDescCreate"));
  MCC_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_TRANSA, key.op_first,
                          "cublasLtMatmulDescSetAttribute(TRANSA)"));
  MCC_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_TRANSB, key.op_second,
                          "cublasLtMatmulDescSetAttribute(TRANSB)"));
  MCC_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_EPILOGUE, key.epilogue,
                          "cublasLtMatmulDescSetAttribute(EPILOGUE)"));
  // Scalar fp32 is cuBLASLt's default scale mode; setting it explicitly
  // would refuse libraries older than the attribute.
  if (key.first_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
    MCC_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                            key.first_scale_mode,
                            "cublasLtMatmulDescSetAttribute(A_SCALE_MODE)"));
  }
  if (key.second_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
    MCC_RETURN_IF_ERROR(set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                            key.second_scale_mode,
                            "cublasLtMatmulDescSetAttribute(B_SCALE_MODE)"));
  }
  MCC_RETURN_IF_ERROR(SetScalePointers(plan->op, first_scale, second_scale));
  // The first operand (op T) is stored k x m, the second k x n.
  MCC_RETURN_IF_ERROR(
      Lt(Cublas().cublasLtMatrixLayoutCreate(&plan->first, key.first_type,
                                             key.k, key.m, key.ld_first),
         "cublasLtMatrixLayoutCreate(A)"));
  MCC_RETURN_IF_ERROR(
      Lt(Cublas().cublasLtMatrixLayoutCreate(&plan->second, key.second_type,
                                             key.k, key.n, key.ld_second),
         "cublasLtMatrixLayoutCreate(B)"));
  MCC_RETURN_IF_ERROR(Lt(Cublas().cublasLtMatrixLayoutCreate(
                             &plan->c, key.c_type, key.m, key.n, key.ldc),
                         "cublasLtMatrixLayoutCreate(C)"));
  // The FP8 copies are fresh allocations: cuBLASLt's default alignment.
  MCC_ASSIGN_OR_RETURN(const CublasLtAlgorithm best,
                       CublasLtBestAlgorithm(
                           handle, plan->op, plan->first, plan->second, plan->c,
                           key.max_workspace, 256, 256, key.c_alignment));
  // Without an algorithm (found false) the plan is kept all the same, so as
  // not to ask again.
  plan->found = best.found;
  plan->algo = best.algo;
  plan->workspace = best.workspace;
  return std::move(plan);
}

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

Fp8LtPlanKey Fp8LtPlanKeyOf(const Fp8LtArgs& args, int device,
                            uint32_t c_alignment) {
  Fp8LtPlanKey key;
  key.device = device;
  key.m = args.m;
  key.n = args.n;
  key.k = args.k;
  key.ld_first = args.ld_first;
  key.ld_second = args.ld_second;
  key.ldc = args.ldc;
  key.first_type = args.first_type;
  key.second_type = args.second_type;
  key.c_type = args.c_type;
  key.scale_type = CUDA_R_32F;
  key.compute = CUBLAS_COMPUTE_32F;
  key.op_first = CUBLAS_OP_T;
  key.op_second = CUBLAS_OP_N;
  key.first_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  key.second_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  key.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  key.max_workspace = kCublasLtWorkspaceBytes;
  key.c_alignment = c_alignment;
  return key;
}

LtPlanCacheCounts Fp8LtPlanCacheCounts(int device) {
  auto* cache = PlanCacheOf(device);
  return cache != nullptr ? cache->Counts() : LtPlanCacheCounts();
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
  // The scales' inverses are bound to it per call.
  Tensor inverses = Tensor::Empty({2}, DType::kFloat32, a.device());
  float* inv = static_cast<float*>(inverses.raw_data());
  const float* first_scale = inv;       // 1 / sb: b is the first operand.
  const float* second_scale = inv + 1;  // 1 / sa
  MCC_ASSIGN_OR_RETURN(cublasLtHandle_t handle, CublasLtHandle(s.device()));
  const internal::Fp8LtPlanKey key =
      internal::Fp8LtPlanKeyOf(args, s.device(), LtAlignmentOf(c->raw_data()));
  // The device index is in range: it has a cuBLASLt handle.
  MCC_ASSIGN_OR_RETURN(std::shared_ptr<Fp8LtPlan> plan,
                       PlanCacheOf(s.device())->GetOrMake(key, [&] {
                         return MakePlan(handle, key, first_scale,
                                         second_scale);
                       }));
  if (!plan->found) {
    return absl::UnimplementedError("cuBLASLt has no FP8 algorithm here");
  }

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
  if (plan->workspace > 0) {
    workspace = Tensor::Empty({static_cast<int64_t>(plan->workspace)},
                              DType::kInt8, a.device());
  }
  std::lock_guard<std::mutex> lock(plan->launch_mu);
  MCC_RETURN_IF_ERROR(SetScalePointers(plan->op, first_scale, second_scale));
  return Lt(Cublas().cublasLtMatmul(
                handle, plan->op, &alpha, first8.raw_data(), plan->first,
                second8.raw_data(), plan->second, &beta, c->raw_data(), plan->c,
                c->raw_data(), plan->c, &plan->algo,
                plan->workspace > 0 ? workspace.raw_data() : nullptr,
                plan->workspace, s.stream()),
            "cublasLtMatmul");
}

}  // namespace cuda
}  // namespace ops
}  // namespace mcc
