#include "core/ops/cuda/grouped_gemm.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/cuda/cublas_library.h"
#include "core/ops/cuda/elementwise.h"
#include "core/ops/cuda/gemm.h"
#include "core/ops/cuda/launch.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

constexpr int64_t kIntMax = 2147483647;

std::atomic<int> g_route{static_cast<int>(internal::GroupedGemmRoute::kAuto)};
std::atomic<int64_t> g_grouped_calls{0};
std::atomic<int64_t> g_per_group_calls{0};

internal::GroupedGemmRoute Route() {
  return static_cast<internal::GroupedGemmRoute>(g_route.load());
}

// Row-major c [m, n] = op(a) [m, k] op(b) [k, n], one group's product.
struct Problem {
  const char* a;
  bool trans_a;
  const char* b;
  bool trans_b;
  char* c;
  int64_t m, n, k;
};

// The [rows, cols] matrix g of a [G, rows, cols] tensor.
absl::StatusOr<Tensor> GroupMatrix(const Tensor& w, int64_t g) {
  MCC_ASSIGN_OR_RETURN(Tensor s, w.Slice(g, g + 1));
  return s.Reshape({w.size(1), w.size(2)});
}

// The column-major arguments of the problems (see CublasGroupedArgs).
absl::StatusOr<internal::CublasGroupedArgs> ArgsOf(
    const char* op, const std::vector<Problem>& problems) {
  internal::CublasGroupedArgs args;
  const int count = static_cast<int>(problems.size());
  args.pointers.resize(3 * count);
  for (int i = 0; i < count; ++i) {
    const Problem& p = problems[i];
    if (p.m > kIntMax || p.n > kIntMax || p.k > kIntMax) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": a group exceeds cuBLAS's int32 (m ", p.m, ", n ",
                       p.n, ", k ", p.k, ")"));
    }
    // Row-major c = op(a) op(b) is column-major c^T = op(b)^T op(a)^T.
    args.op_first.push_back(p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    args.op_second.push_back(p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    args.m.push_back(static_cast<int>(p.n));
    args.n.push_back(static_cast<int>(p.m));
    args.k.push_back(static_cast<int>(p.k));
    args.ld_first.push_back(static_cast<int>(p.trans_b ? p.k : p.n));
    args.ld_second.push_back(static_cast<int>(p.trans_a ? p.m : p.k));
    args.ldc.push_back(static_cast<int>(p.n));
    args.pointers[i] = p.b;
    args.pointers[count + i] = p.a;
    args.pointers[2 * count + i] = p.c;
  }
  return args;
}

// One cublasGemmGroupedBatchedEx call over args, operands and c of
// `dtype`. *ran = false (nothing launched) when cuBLAS reports that it does
// not support the case.
absl::Status RunGrouped(const internal::CublasGroupedArgs& args, DType dtype,
                        float beta, const KernelScope& scope, bool* ran) {
  *ran = false;
  const int count = args.count();
  if (count == 0) {
    *ran = true;
    return absl::OkStatus();
  }
  std::vector<int> group_size(count, 1);
  std::vector<float> alpha(count, 1.0f), betas(count, beta);
  // The pointer arrays live on the device: one upload.
  const Device device = Device::CUDA(scope.device());
  Tensor table =
      Tensor::Empty({3 * static_cast<int64_t>(count)}, DType::kInt64, device);
  MCC_RETURN_IF_ERROR(
      scope.Check(cudaMemcpyAsync(table.raw_data(), args.pointers.data(),
                                  args.pointers.size() * sizeof(void*),
                                  cudaMemcpyHostToDevice, scope.stream())));
  auto* device_pointers = static_cast<void**>(table.raw_data());
  MCC_ASSIGN_OR_RETURN(cublasHandle_t handle, CublasHandle(scope.device()));
  const cudaDataType_t type = CudaDataTypeOf(dtype);
  const cublasComputeType_t compute =
      dtype == DType::kFloat32 && CudaGemmAllowsTf32()
          ? CUBLAS_COMPUTE_32F_FAST_TF32
          : CUBLAS_COMPUTE_32F;
  const cublasStatus_t status = Cublas().cublasGemmGroupedBatchedEx(
      handle, args.op_first.data(), args.op_second.data(), args.m.data(),
      args.n.data(), args.k.data(), alpha.data(), device_pointers, type,
      args.ld_first.data(), device_pointers + count, type,
      args.ld_second.data(), betas.data(), device_pointers + 2 * count, type,
      args.ldc.data(), count, group_size.data(), compute);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED ||
      status == CUBLAS_STATUS_ARCH_MISMATCH) {
    return absl::OkStatus();
  }
  MCC_RETURN_IF_ERROR(CublasToStatus(status, "cublasGemmGroupedBatchedEx"));
  *ran = true;
  return absl::OkStatus();
}

// The problems of GroupedGemm: every group with rows (and outputs).
std::vector<Problem> ForwardProblems(const Tensor& x, const Tensor& w,
                                     bool trans_w,
                                     absl::Span<const int64_t> sizes,
                                     const Tensor& y) {
  const int64_t k = x.size(1), n = y.size(1);
  const size_t xe = DTypeSize(x.dtype()), ye = DTypeSize(y.dtype());
  const char* xp = static_cast<const char*>(x.raw_data());
  const char* wp = static_cast<const char*>(w.raw_data());
  char* yp = static_cast<char*>(y.raw_data());
  std::vector<Problem> problems;
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    if (sizes[g] > 0 && n > 0) {
      problems.push_back(Problem{xp + row * k * xe, false, wp + g * k * n * xe,
                                 trans_w, yp + row * n * ye, sizes[g], n, k});
    }
    row += sizes[g];
  }
  return problems;
}

// The problems of GroupedGemmWeightGrad: every group with rows.
std::vector<Problem> WeightGradProblems(const Tensor& x, const Tensor& dy,
                                        bool trans_w,
                                        absl::Span<const int64_t> sizes,
                                        const Tensor& dw) {
  const int64_t kx = x.size(1), ny = dy.size(1);
  const size_t xe = DTypeSize(x.dtype()), we = DTypeSize(dw.dtype());
  const char* xp = static_cast<const char*>(x.raw_data());
  const char* dp = static_cast<const char*>(dy.raw_data());
  char* wp = static_cast<char*>(dw.raw_data());
  std::vector<Problem> problems;
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    const int64_t m = sizes[g];
    if (m > 0) {
      const char* xg = xp + row * kx * xe;
      const char* dg = dp + row * ny * xe;
      char* wg = wp + g * kx * ny * we;
      // dw_g = x_g^T dy_g [K, N], or dy_g^T x_g [N, K] with trans_w.
      problems.push_back(trans_w ? Problem{dg, true, xg, false, wg, ny, kx, m}
                                 : Problem{xg, true, dg, false, wg, kx, ny, m});
    }
    row += m;
  }
  return problems;
}

// Whether the grouped call is to be tried, or an error when the test route
// demands it for a case it cannot take.
absl::StatusOr<bool> TryGrouped(const char* op, bool supported, DType in,
                                DType out) {
  const internal::GroupedGemmRoute route = Route();
  if (route == internal::GroupedGemmRoute::kPerGroup) return false;
  if (!supported && route == internal::GroupedGemmRoute::kGrouped) {
    return absl::UnimplementedError(absl::StrCat(
        op, ": the grouped call takes one dtype for operands and output, not ",
        DTypeName(in), " -> ", DTypeName(out),
        ", and the per-group route is off for testing"));
  }
  return supported;
}

absl::Status NotRun(const char* op) {
  return absl::UnimplementedError(absl::StrCat(
      op,
      ": cublasGemmGroupedBatchedEx does not support this case and the "
      "per-group route is off for testing"));
}

}  // namespace

absl::Status GroupedGemmCuda(const Tensor& x, const Tensor& w, bool trans_w,
                             absl::Span<const int64_t> sizes, Tensor* y,
                             float beta) {
  const char* op = "GroupedGemm";
  KernelScope scope(op, x);
  MCC_RETURN_IF_ERROR(scope.status());
  const int64_t k = x.size(1);
  MCC_ASSIGN_OR_RETURN(
      const bool grouped,
      TryGrouped(op, y->dtype() == x.dtype(), x.dtype(), y->dtype()));
  if (grouped && k > 0) {  // k == 0: empty products, below.
    MCC_ASSIGN_OR_RETURN(const internal::CublasGroupedArgs args,
                         internal::GroupedGemmArgs(x, w, trans_w, sizes, *y));
    bool ran = false;
    MCC_RETURN_IF_ERROR(RunGrouped(args, x.dtype(), beta, scope, &ran));
    if (ran) {
      g_grouped_calls.fetch_add(1, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    if (Route() == internal::GroupedGemmRoute::kGrouped) return NotRun(op);
  }
  // One GEMM per non-empty group (an empty product, k == 0, included:
  // GemmCuda writes beta * y for it).
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    const int64_t rows = sizes[g];
    if (rows > 0) {
      MCC_ASSIGN_OR_RETURN(Tensor xg, x.Slice(row, row + rows));
      MCC_ASSIGN_OR_RETURN(Tensor yg, y->Slice(row, row + rows));
      MCC_ASSIGN_OR_RETURN(Tensor wg, GroupMatrix(w, g));
      MCC_RETURN_IF_ERROR(GemmCuda(xg, false, wg, trans_w, &yg, 1.0f, beta));
    }
    row += rows;
  }
  g_per_group_calls.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status GroupedGemmWeightGradCuda(const Tensor& x, const Tensor& dy,
                                       bool trans_w,
                                       absl::Span<const int64_t> sizes,
                                       Tensor* dw, float beta) {
  const char* op = "GroupedGemmWeightGrad";
  KernelScope scope(op, x);
  MCC_RETURN_IF_ERROR(scope.status());
  const int64_t kx = x.size(1), ny = dy.size(1);
  const int64_t matrix = kx * ny;
  // Empty groups first: dw_g = beta * dw_g.
  for (size_t g = 0; g < sizes.size(); ++g) {
    if (sizes[g] == 0 && beta != 1.0f && matrix > 0) {
      float* p = static_cast<float*>(dw->raw_data()) + g * matrix;
      if (beta == 0.0f) {
        MCC_RETURN_IF_ERROR(scope.Check(
            cudaMemsetAsync(p, 0, matrix * sizeof(float), scope.stream())));
      } else {
        MCC_RETURN_IF_ERROR(scope.Check(cuda_kernels::Scale(
            p, cuda_kernels::ElemType::kF32, beta, p,
            cuda_kernels::ElemType::kF32, matrix, scope.stream())));
      }
    }
  }
  if (matrix == 0) return absl::OkStatus();
  MCC_ASSIGN_OR_RETURN(
      const bool grouped,
      TryGrouped(op, x.dtype() == DType::kFloat32, x.dtype(), dw->dtype()));
  if (grouped) {
    MCC_ASSIGN_OR_RETURN(
        const internal::CublasGroupedArgs args,
        internal::GroupedWeightGradArgs(x, dy, trans_w, sizes, *dw));
    bool ran = false;
    MCC_RETURN_IF_ERROR(RunGrouped(args, DType::kFloat32, beta, scope, &ran));
    if (ran) {
      g_grouped_calls.fetch_add(1, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    if (Route() == internal::GroupedGemmRoute::kGrouped) return NotRun(op);
  }
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    const int64_t m = sizes[g];
    if (m > 0) {
      MCC_ASSIGN_OR_RETURN(Tensor xg, x.Slice(row, row + m));
      MCC_ASSIGN_OR_RETURN(Tensor dyg, dy.Slice(row, row + m));
      MCC_ASSIGN_OR_RETURN(Tensor dwg, GroupMatrix(*dw, g));
      if (trans_w) {
        MCC_RETURN_IF_ERROR(GemmCuda(dyg, true, xg, false, &dwg, 1.0f, beta));
      } else {
        MCC_RETURN_IF_ERROR(GemmCuda(xg, true, dyg, false, &dwg, 1.0f, beta));
      }
    }
    row += m;
  }
  g_per_group_calls.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

GroupedGemmRouteCounts GroupedGemmRoutes() {
  GroupedGemmRouteCounts counts;
  counts.grouped = g_grouped_calls.load(std::memory_order_relaxed);
  counts.per_group = g_per_group_calls.load(std::memory_order_relaxed);
  return counts;
}

namespace internal {

absl::StatusOr<CublasGroupedArgs> GroupedGemmArgs(
    const Tensor& x, const Tensor& w, bool trans_w,
    absl::Span<const int64_t> sizes, const Tensor& y) {
  return ArgsOf("GroupedGemm", ForwardProblems(x, w, trans_w, sizes, y));
}

absl::StatusOr<CublasGroupedArgs> GroupedWeightGradArgs(
    const Tensor& x, const Tensor& dy, bool trans_w,
    absl::Span<const int64_t> sizes, const Tensor& dw) {
  return ArgsOf("GroupedGemmWeightGrad",
                WeightGradProblems(x, dy, trans_w, sizes, dw));
}

GroupedGemmRoute SetGroupedGemmRouteForTesting(GroupedGemmRoute route) {
  return static_cast<GroupedGemmRoute>(
      g_route.exchange(static_cast<int>(route)));
}

}  // namespace internal
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
