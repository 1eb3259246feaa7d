#include "core/ops/cuda/gemm.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/ops/cuda/cublas_library.h"
#include "core/ops/cuda/elementwise.h"
#include "core/ops/cuda/launch.h"
#include "core/ops/cuda/lt_plan_cache.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr int64_t kIntMax = 2147483647;

std::atomic<bool> g_allow_tf32{false};
std::atomic<int> g_route{static_cast<int>(internal::CudaGemmRoute::kAuto)};
std::atomic<int64_t> g_lt_calls{0};
std::atomic<int64_t> g_fallback_calls{0};

// Whether cuBLAS(Lt) with CUBLAS_COMPUTE_32F takes operands of `in` and a C
// of `out` directly: fp32 -> fp32, and 16-bit operands -> their own type or
// fp32. Other outputs go through an fp32 staging C.
bool DirectOutput(DType in, DType out) {
  return out == DType::kFloat32 ? true : in == out;
}

// One GEMM in cuBLAS's column-major terms. Row-major C = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T, so cuBLAS's first operand is the
// row-major b and its second the row-major a, with the row-major leading
// dimensions.
struct ColumnMajorGemm {
  cublasOperation_t op_first, op_second;
  int64_t m, n, k;  // C is m x n, the inner dimension k.
  int64_t ld_first, ld_second, ldc;
  int64_t batch;  // 1: a single GEMM.
  int64_t stride_first, stride_second, stride_c;
  cudaDataType_t in_type, out_type;
  cublasComputeType_t compute;
};

// What decides cuBLASLt's algorithm: the shape, types, transposes and
// operand alignment, on one device.
struct LtKey {
  int device;
  ColumnMajorGemm g;
  uint32_t align_first, align_second, align_c;

  auto Tie() const {
    return std::make_tuple(
        device, g.op_first, g.op_second, g.m, g.n, g.k, g.ld_first, g.ld_second,
        g.ldc, g.batch, g.stride_first, g.stride_second, g.stride_c, g.in_type,
        g.out_type, g.compute, align_first, align_second, align_c);
  }
  bool operator==(const LtKey& o) const { return Tie() == o.Tie(); }
  template <typename H>
  friend H AbslHashValue(H h, const LtKey& key) {
    return H::combine(std::move(h), key.Tie());
  }
};

// Descriptors and the chosen algorithm for one key; immutable once cached
// (cuBLASLt only reads them), released with their last holder.
using LtPlan = CublasLtPlan;

// Plans held per device.
constexpr size_t kLtPlansPerDevice = 256;

absl::Status Lt(cublasStatus_t status, const char* call) {
  return CublasToStatus(status, call);
}

absl::Status MakeLayout(cudaDataType_t type, bool trans, int64_t rows,
                        int64_t cols, int64_t ld, int64_t batch, int64_t stride,
                        cublasLtMatrixLayout_t* layout) {
  // A transposed operand is stored cols x rows.
  const uint64_t stored_rows = trans ? cols : rows;
  const uint64_t stored_cols = trans ? rows : cols;
  MCC_RETURN_IF_ERROR(Lt(Cublas().cublasLtMatrixLayoutCreate(
                             layout, type, stored_rows, stored_cols, ld),
                         "cublasLtMatrixLayoutCreate"));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    MCC_RETURN_IF_ERROR(Lt(
        Cublas().cublasLtMatrixLayoutSetAttribute(
            *layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
        "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)"));
    MCC_RETURN_IF_ERROR(
        Lt(Cublas().cublasLtMatrixLayoutSetAttribute(
               *layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
               sizeof(stride)),
           "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)"));
  }
  return absl::OkStatus();
}

// Builds the descriptors and asks the heuristic for its best algorithm;
// found == false (and no descriptors) when it has none.
absl::Status MakePlan(cublasLtHandle_t handle, const LtKey& key, LtPlan* plan) {
  const ColumnMajorGemm& g = key.g;
  auto fail = [plan](absl::Status s) {
    plan->Release();
    return s;
  };
  absl::Status s =
      Lt(Cublas().cublasLtMatmulDescCreate(&plan->op, g.compute, CUDA_R_32F),
         "cublasLtMatmulDescCreate");
  if (!s.ok()) return fail(s);
  s = Lt(Cublas().cublasLtMatmulDescSetAttribute(
             plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &g.op_first,
             sizeof(g.op_first)),
         "cublasLtMatmulDescSetAttribute(TRANSA)");
  if (!s.ok()) return fail(s);
  s = Lt(Cublas().cublasLtMatmulDescSetAttribute(
             plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &g.op_second,
             sizeof(g.op_second)),
         "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (!s.ok()) return fail(s);
  s = MakeLayout(g.in_type, g.op_first != CUBLAS_OP_N, g.m, g.k, g.ld_first,
                 g.batch, g.stride_first, &plan->first);
  if (!s.ok()) return fail(s);
  s = MakeLayout(g.in_type, g.op_second != CUBLAS_OP_N, g.k, g.n, g.ld_second,
                 g.batch, g.stride_second, &plan->second);
  if (!s.ok()) return fail(s);
  s = MakeLayout(g.out_type, false, g.m, g.n, g.ldc, g.batch, g.stride_c,
                 &plan->c);
  if (!s.ok()) return fail(s);

  absl::StatusOr<CublasLtAlgorithm> best = CublasLtBestAlgorithm(
      handle, plan->op, plan->first, plan->second, plan->c,
      kCublasLtWorkspaceBytes, key.align_first, key.align_second, key.align_c);
  if (!best.ok()) return fail(best.status());
  if (!best->found) {
    plan->Release();  // No algorithm: the caller falls back.
    return absl::OkStatus();
  }
  plan->found = true;
  plan->algo = best->algo;
  plan->workspace = best->workspace;
  return absl::OkStatus();
}

// The cached plan for a key (built on first use; key.device is in range:
// it has a cuBLASLt handle).
absl::StatusOr<std::shared_ptr<LtPlan>> PlanFor(cublasLtHandle_t handle,
                                                const LtKey& key) {
  static auto* caches =
      new PerDeviceLtPlanCaches<LtKey, LtPlan>(kMaxDevices, kLtPlansPerDevice);
  return caches->Of(key.device)
      ->GetOrMake(key, [&]() -> absl::StatusOr<std::unique_ptr<LtPlan>> {
        auto plan = std::make_unique<LtPlan>();
        MCC_RETURN_IF_ERROR(MakePlan(handle, key, plan.get()));
        return std::move(plan);
      });
}

// Runs g through cuBLASLt; *ran = false (nothing launched) when it has no
// algorithm for it.
absl::Status RunLt(const ColumnMajorGemm& g, const void* first,
                   const void* second, void* c, float alpha, float beta,
                   const Device& device, cudaStream_t stream, bool* ran) {
  *ran = false;
  MCC_ASSIGN_OR_RETURN(cublasLtHandle_t handle, CublasLtHandle(device.index));
  LtKey key{device.index, g, LtAlignmentOf(first), LtAlignmentOf(second),
            LtAlignmentOf(c)};
  MCC_ASSIGN_OR_RETURN(const std::shared_ptr<LtPlan> plan,
                       PlanFor(handle, key));
  if (!plan->found) return absl::OkStatus();
  // From the caching allocator; later work in this stream's order may reuse
  // it once the call is queued, as with the staging buffers.
  Tensor workspace;
  if (plan->workspace > 0) {
    workspace = Tensor::Empty({static_cast<int64_t>(plan->workspace)},
                              DType::kInt8, device);
  }
  MCC_RETURN_IF_ERROR(
      Lt(Cublas().cublasLtMatmul(
             handle, plan->op, &alpha, first, plan->first, second, plan->second,
             &beta, c, plan->c, c, plan->c, &plan->algo,
             plan->workspace > 0 ? workspace.raw_data() : nullptr,
             plan->workspace, stream),
         "cublasLtMatmul"));
  *ran = true;
  return absl::OkStatus();
}

absl::Status RunCublas(const ColumnMajorGemm& g, const void* first,
                       const void* second, void* c, float alpha, float beta,
                       int device) {
  MCC_ASSIGN_OR_RETURN(cublasHandle_t handle, CublasHandle(device));
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n),
            k = static_cast<int>(g.k);
  const int ld_first = static_cast<int>(g.ld_first),
            ld_second = static_cast<int>(g.ld_second),
            ldc = static_cast<int>(g.ldc);
  if (g.batch == 1) {
    return CublasToStatus(
        Cublas().cublasGemmEx(handle, g.op_first, g.op_second, m, n, k, &alpha,
                              first, g.in_type, ld_first, second, g.in_type,
                              ld_second, &beta, c, g.out_type, ldc, g.compute,
                              CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  }
  return CublasToStatus(
      Cublas().cublasGemmStridedBatchedEx(
          handle, g.op_first, g.op_second, m, n, k, &alpha, first, g.in_type,
          ld_first, g.stride_first, second, g.in_type, ld_second,
          g.stride_second, &beta, c, g.out_type, ldc, g.stride_c,
          static_cast<int>(g.batch), g.compute, CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
}

absl::Status RunGemm(const char* op, const Tensor& a, bool trans_a,
                     const Tensor& b, bool trans_b, Tensor* c, float alpha,
                     float beta, bool batched) {
  const int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t n = trans_b ? b.size(-2) : b.size(-1);
  int64_t batch = batched ? c->size(0) : 1;
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

  // A shared b under an untransposed a is one GEMM with batch * m rows (the
  // entries of a and c are consecutive row blocks).
  int64_t rows = m;
  if (b_shared && !trans_a && batch * m <= kIntMax) {
    rows = batch * m;
    batch = 1;
  }
  ColumnMajorGemm g;
  g.op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.m = n;
  g.n = rows;
  g.k = k;
  g.ld_first = trans_b ? k : n;
  g.ld_second = trans_a ? m : k;
  g.ldc = n;
  g.batch = batch;
  // A shared b is batch stride 0: every entry reads the same matrix.
  g.stride_first = batch > 1 && !b_shared ? k * n : 0;
  g.stride_second = batch > 1 ? m * k : 0;
  g.stride_c = batch > 1 ? m * n : 0;
  g.in_type = CudaDataTypeOf(a.dtype());
  g.out_type = CudaDataTypeOf(out.dtype());
  g.compute = a.dtype() == DType::kFloat32 && g_allow_tf32.load()
                  ? CUBLAS_COMPUTE_32F_FAST_TF32
                  : CUBLAS_COMPUTE_32F;

  const auto route = static_cast<internal::CudaGemmRoute>(g_route.load());
  bool ran = false;
  if (route != internal::CudaGemmRoute::kCublas) {
    MCC_RETURN_IF_ERROR(RunLt(g, b.raw_data(), a.raw_data(), out.raw_data(),
                              alpha, beta, c->device(), stream, &ran));
    if (!ran && route == internal::CudaGemmRoute::kCublasLt) {
      return absl::UnimplementedError(absl::StrCat(
          op, ": cuBLASLt has no algorithm for m ", m, " n ", n, " k ", k,
          " batch ", batch, " (", DTypeName(a.dtype()), " -> ",
          DTypeName(out.dtype()), ") and the fallback is off for testing"));
    }
  }
  if (ran) {
    g_lt_calls.fetch_add(1, std::memory_order_relaxed);
  } else {
    MCC_RETURN_IF_ERROR(RunCublas(g, b.raw_data(), a.raw_data(), out.raw_data(),
                                  alpha, beta, c->device().index));
    g_fallback_calls.fetch_add(1, std::memory_order_relaxed);
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
  return absl::InternalError(absl::StrCat(
      call, " failed: ",
      CublasLoaded() ? Cublas().cublasGetStatusString(status) : "status", " (",
      static_cast<int>(status), ")"));
}

absl::StatusOr<cublasHandle_t> CublasHandle(int device) {
  MCC_RETURN_IF_ERROR(::mcc::cuda::CheckDeviceIndex(device));
  if (device >= kMaxDevices) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuBLAS: device index ", device, " beyond ", kMaxDevices));
  }
  MCC_RETURN_IF_ERROR(LoadCublas().status());
  // Never destroyed: destroying at thread or process exit can race the
  // driver's own teardown.
  thread_local cublasHandle_t handles[kMaxDevices] = {};
  cublasHandle_t& handle = handles[device];
  ::mcc::cuda::DeviceGuard guard(device);
  if (handle == nullptr) {
    MCC_RETURN_IF_ERROR(
        CublasToStatus(Cublas().cublasCreate(&handle), "cublasCreate"));
  }
  MCC_RETURN_IF_ERROR(CublasToStatus(
      Cublas().cublasSetStream(handle, ::mcc::cuda::CurrentStream(device)),
      "cublasSetStream"));
  return handle;
}

CublasLtPlan::~CublasLtPlan() { Release(); }

void CublasLtPlan::Release() {
  if (op) Cublas().cublasLtMatmulDescDestroy(op);
  if (first) Cublas().cublasLtMatrixLayoutDestroy(first);
  if (second) Cublas().cublasLtMatrixLayoutDestroy(second);
  if (c) Cublas().cublasLtMatrixLayoutDestroy(c);
  op = nullptr;
  first = second = c = nullptr;
  found = false;
}

absl::StatusOr<CublasLtAlgorithm> CublasLtBestAlgorithm(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
    cublasLtMatrixLayout_t first, cublasLtMatrixLayout_t second,
    cublasLtMatrixLayout_t c, uint64_t max_workspace, uint32_t align_first,
    uint32_t align_second, uint32_t align_c) {
  cublasLtMatmulPreference_t pref = nullptr;
  MCC_RETURN_IF_ERROR(
      CublasToStatus(Cublas().cublasLtMatmulPreferenceCreate(&pref),
                     "cublasLtMatmulPreferenceCreate"));
  cublasStatus_t st = Cublas().cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
      sizeof(max_workspace));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_first},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_second},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c},
  };
  for (const auto& [attr, value] : aligns) {
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = Cublas().cublasLtMatmulPreferenceSetAttribute(pref, attr, &value,
                                                         sizeof(value));
    }
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int returned = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = Cublas().cublasLtMatmulAlgoGetHeuristic(
        handle, op, first, second, c, c, pref, 1, &result, &returned);
  }
  Cublas().cublasLtMatmulPreferenceDestroy(pref);
  CublasLtAlgorithm best;
  if (st == CUBLAS_STATUS_NOT_SUPPORTED ||
      (st == CUBLAS_STATUS_SUCCESS &&
       (returned == 0 || result.state != CUBLAS_STATUS_SUCCESS))) {
    return best;  // found == false
  }
  MCC_RETURN_IF_ERROR(CublasToStatus(st, "cublasLtMatmulAlgoGetHeuristic"));
  best.found = true;
  best.algo = result.algo;
  best.workspace = result.workspaceSize;
  return best;
}

absl::StatusOr<cublasLtHandle_t> CublasLtHandle(int device) {
  MCC_RETURN_IF_ERROR(::mcc::cuda::CheckDeviceIndex(device));
  if (device >= kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuBLASLt: device index ", device, " beyond ", kMaxDevices));
  }
  MCC_RETURN_IF_ERROR(LoadCublas().status());
  thread_local cublasLtHandle_t handles[kMaxDevices] = {};  // As above.
  cublasLtHandle_t& handle = handles[device];
  if (handle == nullptr) {
    ::mcc::cuda::DeviceGuard guard(device);
    MCC_RETURN_IF_ERROR(
        CublasToStatus(Cublas().cublasLtCreate(&handle), "cublasLtCreate"));
  }
  return handle;
}

bool SetCudaGemmAllowTf32(bool allow) { return g_allow_tf32.exchange(allow); }
bool CudaGemmAllowsTf32() { return g_allow_tf32.load(); }

CudaGemmRouteCounts CudaGemmRoutes() {
  CudaGemmRouteCounts counts;
  counts.cublas_lt = g_lt_calls.load(std::memory_order_relaxed);
  counts.cublas_fallback = g_fallback_calls.load(std::memory_order_relaxed);
  return counts;
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

cudaDataType_t CudaDataTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

namespace internal {

CudaGemmRoute SetCudaGemmRouteForTesting(CudaGemmRoute route) {
  return static_cast<CudaGemmRoute>(g_route.exchange(static_cast<int>(route)));
}

}  // namespace internal
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
