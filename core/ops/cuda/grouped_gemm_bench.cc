// The grouped GEMM's rate on the GPU against one dense GEMM of the same
// FLOPs (issue 41's benchmark: at least 85% of the dense rate), through the
// dispatch ops: an MoE layer's expert fc1 (x [M, h] times E weights
// [f, h]^T, bf16) with the M rows split evenly over the experts and skewed
// (half the rows to one expert), on each route (the grouped
// cublasGemmGroupedBatchedEx call, and one cuBLASLt GEMM per expert), and
// the bf16 weight gradient into fp32. The dense GEMM is x [M, h] times one
// [f, h]^T. Prints one line per case and a last line
//   GROUPED GEMM: ok (grouped/dense even 0.93, skewed 0.91; ...)
// Prints "no CUDA device" and exits 0 without a GPU.
//
//   grouped_gemm_bench [--iters=20] [--experts=8] [--rows=8192]
//                      [--hidden=2048] [--ffn=1408]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/cuda/event.h"
#include "core/cuda/runtime.h"
#include "core/ops/cuda/grouped_gemm.h"
#include "core/ops/gemm.h"
#include "core/ops/grouped_gemm.h"
#include "core/status_macros.h"

ABSL_FLAG(int, iters, 20, "timed iterations per measurement");
ABSL_FLAG(int64_t, experts, 8, "experts (groups)");
ABSL_FLAG(int64_t, rows, 8192, "rows over all experts (tokens * topk)");
ABSL_FLAG(int64_t, hidden, 2048, "the inner dimension (hidden size)");
ABSL_FLAG(int64_t, ffn, 1408, "the output columns (expert ffn size)");

namespace mcc {
namespace {

namespace oc = ::mcc::ops::cuda;
const Device kGpu = Device::CUDA(0);

double TimeMs(const std::function<void()>& fn) {
  fn();
  fn();
  cuda::Event start = *cuda::Event::Create(0);
  cuda::Event end = *cuda::Event::Create(0);
  const int iters = absl::GetFlag(FLAGS_iters);
  MCC_CHECK_OK(start.Record());
  for (int i = 0; i < iters; ++i) fn();
  MCC_CHECK_OK(end.Record());
  MCC_CHECK_OK(end.Synchronize());
  return *end.ElapsedMsSince(start) / iters;
}

Tensor Random(const Shape& shape, DType dtype) {
  const int64_t n = NumElements(shape);
  std::vector<float> v(n);
  uint32_t s = 12345;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = -1.0f + 2.0f * ((s >> 8) * (1.0f / 16777216.0f));
  }
  return *Tensor::FromVector(v, shape, dtype)->To(kGpu);
}

double Tflops(int64_t m, int64_t n, int64_t k, double ms) {
  return 2.0 * m * n * k / (ms * 1e-3) / 1e12;
}

int Run() {
  const int64_t e = absl::GetFlag(FLAGS_experts), m = absl::GetFlag(FLAGS_rows),
                h = absl::GetFlag(FLAGS_hidden), f = absl::GetFlag(FLAGS_ffn);
  const Tensor x = Random({m, h}, DType::kBFloat16);
  const Tensor w = Random({e, f, h}, DType::kBFloat16);
  const Tensor dense_w = Random({f, h}, DType::kBFloat16);
  Tensor y = Tensor::Empty({m, f}, DType::kBFloat16, kGpu);
  const double dense_ms =
      TimeMs([&] { MCC_CHECK_OK(ops::Gemm(x, false, dense_w, true, &y)); });
  const double dense = Tflops(m, f, h, dense_ms);
  std::printf(
      "dense GEMM bf16 [%ld, %ld] x [%ld, %ld]^T: %.3f ms, %.1f TFLOP/s\n", m,
      h, f, h, dense_ms, dense);
  std::vector<int64_t> even(e, m / e);
  even[0] += m - std::accumulate(even.begin(), even.end(), int64_t{0});
  std::vector<int64_t> skewed(e, m / (2 * (e - 1 > 0 ? e - 1 : 1)));
  if (e > 1) {
    skewed[0] = 0;
    skewed[0] = m - std::accumulate(skewed.begin(), skewed.end(), int64_t{0});
  }
  std::string summary;
  bool ok = true;
  const struct {
    const char* name;
    oc::internal::GroupedGemmRoute route;
  } routes[] = {{"grouped", oc::internal::GroupedGemmRoute::kGrouped},
                {"per-expert", oc::internal::GroupedGemmRoute::kPerGroup}};
  for (const auto& r : routes) {
    oc::internal::SetGroupedGemmRouteForTesting(r.route);
    for (const auto& [name, sizes] :
         {std::pair<const char*, const std::vector<int64_t>&>{"even", even},
          std::pair<const char*, const std::vector<int64_t>&>{"skewed",
                                                              skewed}}) {
      absl::Status status;
      const double ms = TimeMs([&] {
        absl::Status s = ops::GroupedGemm(x, w, true, sizes, &y);
        if (!s.ok()) status = s;
      });
      if (!status.ok()) {
        std::printf("%s %s: %s\n", r.name, name, status.ToString().c_str());
        ok = false;
        continue;
      }
      const double rate = Tflops(m, f, h, ms);
      std::printf(
          "grouped GEMM %s, %s sizes (largest %ld of %ld rows): "
          "%.3f ms, %.1f TFLOP/s, %.2f of dense\n",
          r.name, name, *std::max_element(sizes.begin(), sizes.end()), m, ms,
          rate, rate / dense);
      absl::StrAppend(&summary, summary.empty() ? "" : ", ", r.name, "/dense ",
                      name, " ", absl::StrFormat("%.2f", rate / dense));
    }
  }
  oc::internal::SetGroupedGemmRouteForTesting(
      oc::internal::GroupedGemmRoute::kAuto);
  // The weight gradient, bf16 into the fp32 main_grad (per expert: the
  // grouped call takes one dtype), against the dense one.
  Tensor dy = Random({m, f}, DType::kBFloat16);
  Tensor dw = Tensor::Zeros({e, f, h}, DType::kFloat32, kGpu);
  Tensor dense_dw = Tensor::Zeros({f, h}, DType::kFloat32, kGpu);
  const double dense_wg_ms = TimeMs([&] {
    MCC_CHECK_OK(ops::Gemm(dy, true, x, false, &dense_dw, 1.0f, 1.0f));
  });
  const double wg_ms = TimeMs([&] {
    MCC_CHECK_OK(ops::GroupedGemmWeightGrad(x, dy, true, even, &dw, 1.0f));
  });
  std::printf(
      "weight grad bf16 -> fp32, even sizes: grouped %.3f ms, dense "
      "%.3f ms, %.2f of dense\n",
      wg_ms, dense_wg_ms, dense_wg_ms / wg_ms);
  absl::StrAppend(&summary, ", weight grad/dense ",
                  absl::StrFormat("%.2f", dense_wg_ms / wg_ms));
  std::printf("GROUPED GEMM: %s (%s; E %ld, rows %ld, h %ld, f %ld, bf16)\n",
              ok ? "ok" : "FAILED", summary.c_str(), e, m, h, f);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace mcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (mcc::cuda::CudaDeviceCount() == 0) {
    std::printf("no CUDA device: grouped GEMM bench skipped\n");
    return 0;
  }
  std::printf("device: %s\n", mcc::cuda::DeviceDescription(0)->c_str());
  return mcc::Run();
}
