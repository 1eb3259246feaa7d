// RowGemm (the engine's batch-invariant GEMM, fp32 and int8 weights)
// against oneDNN's sgemm through ops::Gemm on the same shapes, measured in
// the same run: the decode shapes of the serve benchmark's model (hidden
// 512: QKV 512 -> 1536, fc1 512 -> 2048, fc2 2048 -> 512) at 1 to 64 rows.
//   tools/bazel run -c opt //inference:row_gemm_bench [-- THREADS]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/ops/cpu_isa.h"
#include "core/ops/gemm.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "inference/row_gemm.h"

namespace {

// Best GFLOP/s of fn over about 0.3 s.
template <typename Fn>
double Rate(double flops, Fn fn) {
  double best = 0;
  const absl::Time end = absl::Now() + absl::Milliseconds(300);
  while (absl::Now() < end) {
    const absl::Time t0 = absl::Now();
    fn();
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    if (s > 0) best = std::max(best, flops / s / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  if (threads > 0) mcc::ThreadPool::SetGlobalThreads(threads);
  std::printf("kernel ISA %s, %d threads\n",
              mcc::ops::CpuIsaName(mcc::ops::KernelIsa()),
              mcc::ThreadPool::Global().num_threads());
  std::printf(
      "| k -> n | rows | RowGemm GFLOP/s | RowGemmInt8 GFLOP/s | sgemm "
      "GFLOP/s | RowGemm / sgemm |\n|---|---|---|---|---|---|\n");
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  const int shapes[][2] = {{512, 1536}, {512, 2048}, {2048, 512}};
  for (const auto& shape : shapes) {
    const int64_t k = shape[0], n = shape[1];
    std::vector<float> w(n * k);
    for (float& v : w) v = dist(rng);
    std::vector<int8_t> q(n * k);
    for (int8_t& v : q)
      v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    std::vector<float> scales(n, 0.01f);
    // Packed once, as the engine packs its weights at load.
    const mcc::inference::RowGemmWeights packed =
        mcc::inference::RowGemmWeights::Pack(w.data(), n, k);
    const mcc::inference::RowGemmWeights packed8 =
        mcc::inference::RowGemmWeights::PackInt8(q.data(), scales.data(), n, k);
    for (int64_t rows : {1, 8, 32, 64}) {
      std::vector<float> x(rows * k), y(rows * n);
      for (float& v : x) v = dist(rng);
      const double flops = 2.0 * rows * k * n;
      const double row_gemm = Rate(flops, [&] {
        mcc::inference::RowGemm(x.data(), rows, packed, y.data());
      });
      const double row_int8 = Rate(flops, [&] {
        mcc::inference::RowGemm(x.data(), rows, packed8, y.data());
      });
      mcc::Tensor a =
          *mcc::Tensor::FromVector(x, {rows, k}, mcc::DType::kFloat32);
      mcc::Tensor b = *mcc::Tensor::FromVector(w, {n, k}, mcc::DType::kFloat32);
      mcc::Tensor c = mcc::Tensor::Empty({rows, n}, mcc::DType::kFloat32);
      const double sgemm = Rate(flops, [&] {
        if (!mcc::ops::Gemm(a, false, b, true, &c).ok()) std::abort();
      });
      std::printf("| %lld -> %lld | %lld | %.1f | %.1f | %.1f | %.2f |\n",
                  static_cast<long long>(k), static_cast<long long>(n),
                  static_cast<long long>(rows), row_gemm, row_int8, sgemm,
                  row_gemm / sgemm);
    }
  }
  return 0;
}
