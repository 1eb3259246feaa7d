// The grouped GEMM of an MoE layer's experts beside one dense GEMM of the
// same FLOPs (issue 41's target: 85% of the dense rate), in one run:
//   tools/bazel run //core/ops:grouped_gemm_bench [-- --threads N]
// Shapes: E experts, R = tokens x top-k routed rows split evenly or skewed
// (expert e gets a share proportional to e + 1), fc1-like x [R, h] W_e^T
// with W_e [f, h]; the dense GEMM is x [R, h] W^T with W [f, h]. Prints
// GFLOP/s (2 R f h per call, median of --reps calls) and the ratio; "loop"
// is one Gemm per expert, each on all threads (the grouped GEMM before it
// spread the rows over the threads), measured alongside for comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/ops/gemm.h"
#include "core/ops/grouped_gemm.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

ABSL_FLAG(int32_t, threads, 0, "Threads (0: the global pool's default).");
ABSL_FLAG(int32_t, reps, 9, "Timed calls per measurement (median taken).");

namespace mcc {
namespace ops {
namespace {

template <typename Fn>
double MedianSeconds(int reps, Fn fn) {
  fn();  // Warm-up (and the bf16 path's first-use timing).
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<int64_t> Split(int64_t rows, int64_t experts, bool skewed) {
  std::vector<int64_t> sizes(experts);
  int64_t weight_sum = 0, given = 0;
  for (int64_t e = 0; e < experts; ++e) weight_sum += skewed ? e + 1 : 1;
  for (int64_t e = 0; e < experts; ++e) {
    sizes[e] = rows * (skewed ? e + 1 : 1) / weight_sum;
    given += sizes[e];
  }
  sizes[experts - 1] += rows - given;
  return sizes;
}

void Run() {
  if (absl::GetFlag(FLAGS_threads) > 0) {
    ThreadPool::SetGlobalThreads(absl::GetFlag(FLAGS_threads));
  }
  const int reps = absl::GetFlag(FLAGS_reps);
  std::printf("threads %d\n", ThreadPool::Global().num_threads());
  std::printf("%5s %3s %5s %5s %6s %7s | %8s %8s %8s | %6s %6s\n", "dtype", "E",
              "R", "h", "f", "split", "dense", "loop", "grouped", "loop",
              "ratio");
  struct Shape {
    int64_t experts, rows, h, f;
  };
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    for (const Shape& s : {Shape{8, 4096, 512, 1408}, Shape{8, 4096, 1024, 512},
                           Shape{64, 4096, 512, 256}}) {
      for (bool skewed : {false, true}) {
        Tensor x = Tensor::Full({s.rows, s.h}, 0.5, dt);
        Tensor w = Tensor::Full({s.experts, s.f, s.h}, 0.25, dt);
        Tensor wd = w.Slice(0, 1).value().Reshape({s.f, s.h}).value();
        Tensor y = Tensor::Empty({s.rows, s.f}, DType::kFloat32);
        const std::vector<int64_t> sizes = Split(s.rows, s.experts, skewed);
        const double flops = 2.0 * s.rows * s.f * s.h;
        const double dense =
            MedianSeconds(reps, [&]() { (void)Gemm(x, false, wd, true, &y); });
        const double grouped = MedianSeconds(
            reps, [&]() { (void)GroupedGemm(x, w, true, sizes, &y); });
        const double loop = MedianSeconds(reps, [&]() {
          int64_t row = 0;
          for (int64_t e = 0; e < s.experts; ++e) {
            if (sizes[e] == 0) continue;
            Tensor xe = x.Slice(row, row + sizes[e]).value();
            Tensor ye = y.Slice(row, row + sizes[e]).value();
            Tensor we = w.Slice(e, e + 1).value().Reshape({s.f, s.h}).value();
            (void)Gemm(xe, false, we, true, &ye);
            row += sizes[e];
          }
        });
        std::printf(
            "%5s %3lld %5lld %5lld %6lld %7s | %8.1f %8.1f %8.1f | %5.0f%% "
            "%5.0f%%\n",
            std::string(DTypeName(dt)).c_str(),
            static_cast<long long>(s.experts), static_cast<long long>(s.rows),
            static_cast<long long>(s.h), static_cast<long long>(s.f),
            skewed ? "skewed" : "even", flops / dense * 1e-9,
            flops / loop * 1e-9, flops / grouped * 1e-9, 100.0 * dense / loop,
            100.0 * dense / grouped);
      }
    }
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  mcc::ops::Run();
  return 0;
}
