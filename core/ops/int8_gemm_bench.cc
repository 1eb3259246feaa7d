// The weight-only int8 GEMM beside oneDNN's fp32 sgemm on the same
// decode-like shapes (y = x W^T, x [M, K], W [N, K], M = 1..64; 128 and 256
// for the crossover to the sgemm path), in one run:
//   tools/bazel run //core/ops:int8_gemm_bench [-- --threads N]
// Prints GFLOP/s (2 M N K per call, median of --reps timed calls) for the
// fp32 sgemm, the automatic int8 choice and each int8 path.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/ops/cpu_isa.h"
#include "core/ops/gemm.h"
#include "core/ops/int8_gemm.h"
#include "core/thread_pool.h"

ABSL_FLAG(int32_t, threads, 0, "Threads (0: the global pool's default).");
ABSL_FLAG(int32_t, reps, 15, "Timed calls per measurement (median taken).");

namespace mcc {
namespace ops {
namespace {

template <typename Fn>
double MedianSeconds(int reps, Fn fn) {
  fn();  // Warm-up.
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

void Run() {
  if (absl::GetFlag(FLAGS_threads) > 0) {
    ThreadPool::SetGlobalThreads(absl::GetFlag(FLAGS_threads));
  }
  const int reps = absl::GetFlag(FLAGS_reps);
  std::printf("threads %d, kernel ISA %s\n", ThreadPool::Global().num_threads(),
              CpuIsaName(KernelIsa()));
  std::printf("%6s %6s %4s | %8s | %8s %8s %8s %8s | auto path\n", "N", "K",
              "M", "fp32", "int8", "direct", "dequant", "scalar");
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  const Int8GemmPath direct = KernelIsa() == CpuIsa::kAvx512
                                  ? Int8GemmPath::kAvx512
                                  : Int8GemmPath::kAvx2;
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {3072, 1024}, {1024, 1024}, {4096, 1024}, {1024, 4096}}) {
    std::vector<float> w(n * k), s(n);
    std::vector<int8_t> q(n * k);
    for (auto& v : w) v = dist(gen);
    for (int64_t i = 0; i < n * k; ++i) q[i] = static_cast<int8_t>(127 * w[i]);
    for (auto& v : s) v = 0.01f;
    for (int64_t m : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
      std::vector<float> x(m * k), y(m * n);
      for (auto& v : x) v = dist(gen);
      const double flop = 2.0 * m * n * k;
      auto gflops = [&](double sec) { return flop / sec / 1e9; };
      const double f32 = MedianSeconds(reps, [&] {
        GemmF32(false, true, m, n, k, 1.0f, x.data(), k, w.data(), k, 0.0f,
                y.data(), n);
      });
      auto int8 = [&](Int8GemmPath path) {
        return MedianSeconds(reps, [&] {
          Int8GemmF32(m, n, k, x.data(), k, q.data(), s.data(), y.data(), n,
                      path);
        });
      };
      const double automatic = int8(Int8GemmPath::kAuto);
      const double d = int8(direct);
      const double dq = int8(Int8GemmPath::kDequantSgemm);
      const double sc = m <= 4 ? int8(Int8GemmPath::kScalar) : 0;
      std::printf("%6lld %6lld %4lld | %8.1f | %8.1f %8.1f %8.1f %8.1f | %s\n",
                  static_cast<long long>(n), static_cast<long long>(k),
                  static_cast<long long>(m), gflops(f32), gflops(automatic),
                  gflops(d), gflops(dq), sc > 0 ? gflops(sc) : 0.0,
                  Int8GemmPathName(Int8GemmAutoPath(m)));
      std::fflush(stdout);
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
