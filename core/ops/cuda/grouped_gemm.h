// CUDA kernels of the GroupedGemm and GroupedGemmWeightGrad slots
// (core/ops/grouped_gemm.h), with the CPU kernels' contract: one product
// per group of rows (the experts of a mixture-of-experts layer), group sizes
// on the host, fp32 accumulation.
//
// Routes:
//  - grouped: one cublasGemmGroupedBatchedEx call for every non-empty group
//    (each group its own problem: m, n, k differ), when the operands and the
//    output share one dtype (fp32 -> fp32, bf16 -> bf16, fp16 -> fp16), the
//    types that call takes. The problems' device pointers go up in one
//    host-to-device copy per call. cuBLASLt (13.1, the toolkit here) has no
//    grouped matmul with per-group sizes, so this is cuBLAS's.
//  - per group: one ops::Gemm per non-empty group (cuBLASLt, as
//    core/ops/cuda/gemm.h), for the mixes the grouped call does not take
//    (16-bit operands into an fp32 output: the weight gradient of a bf16 or
//    fp16 model into its fp32 main_grad), and whenever the grouped call
//    reports that it cannot run a case.
// Either way a group's result depends only on its own rows and weights, and
// a call repeats its bits. An empty group's dw_g is beta * dw_g (zeroed for
// beta == 0), as on the CPU. They run on the device's current stream and
// never synchronise (the pointer upload is from pageable host memory, which
// cudaMemcpyAsync stages before it returns).
#ifndef CORE_OPS_CUDA_GROUPED_GEMM_H_
#define CORE_OPS_CUDA_GROUPED_GEMM_H_

#include <cublas_v2.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {
namespace cuda {

// The slot kernels (arguments validated by the ops).
absl::Status GroupedGemmCuda(const Tensor& x, const Tensor& w, bool trans_w,
                             absl::Span<const int64_t> sizes, Tensor* y,
                             float beta);
absl::Status GroupedGemmWeightGradCuda(const Tensor& x, const Tensor& dy,
                                       bool trans_w,
                                       absl::Span<const int64_t> sizes,
                                       Tensor* dw, float beta);

// How many calls each route has run so far in this process.
struct GroupedGemmRouteCounts {
  int64_t grouped = 0;    // cublasGemmGroupedBatchedEx calls
  int64_t per_group = 0;  // calls that ran one GEMM per group
};
GroupedGemmRouteCounts GroupedGemmRoutes();

namespace internal {
// For tests and the benchmark: kPerGroup never takes the grouped call;
// kGrouped makes a case it cannot run an error instead of the per-group
// route. Returns the previous setting.
enum class GroupedGemmRoute { kAuto, kGrouped, kPerGroup };
GroupedGemmRoute SetGroupedGemmRouteForTesting(GroupedGemmRoute route);

// The arguments of the grouped route's cublasGemmGroupedBatchedEx call, in
// cuBLAS's column-major terms (each non-empty group a problem of its own),
// with the operands' addresses as the tensors hold them (host addresses
// for CPU tensors, so a test without a GPU can run the mapping through a
// column-major reference). alpha is 1 for every problem.
struct CublasGroupedArgs {
  std::vector<cublasOperation_t> op_first, op_second;
  std::vector<int> m, n, k, ld_first, ld_second, ldc;
  // The first operands, then the second, then the outputs: count() each.
  std::vector<const void*> pointers;
  int count() const { return static_cast<int>(m.size()); }
};
// y = x op(w) per group (GroupedGemm), and dw (GroupedGemmWeightGrad's);
// InvalidArgument when a group exceeds cuBLAS's int32.
absl::StatusOr<CublasGroupedArgs> GroupedGemmArgs(
    const Tensor& x, const Tensor& w, bool trans_w,
    absl::Span<const int64_t> sizes, const Tensor& y);
absl::StatusOr<CublasGroupedArgs> GroupedWeightGradArgs(
    const Tensor& x, const Tensor& dy, bool trans_w,
    absl::Span<const int64_t> sizes, const Tensor& dw);
}  // namespace internal

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_GROUPED_GEMM_H_
