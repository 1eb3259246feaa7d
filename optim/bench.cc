// Optimizer step throughput: AdamW and SGD over fp32 or bf16 parameters
// (fp32 main copies), including the global-norm pass, against memcpy.
//   tools/bazel run //optim:bench [-- --numel=8388608]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/comm/process_group.h"
#include "core/thread_pool.h"
#include "optim/optimizer.h"

ABSL_FLAG(int64_t, numel, 8 << 20, "Parameter elements (split in 8 tensors).");
ABSL_FLAG(int, iters, 10, "Timed steps.");

namespace mcc {
namespace optim {
namespace {

double Seconds(const std::function<void()>& fn, int iters) {
  fn();  // Warm up.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count() / iters;
}

void Run() {
  const int64_t numel = absl::GetFlag(FLAGS_numel);
  const int iters = absl::GetFlag(FLAGS_iters);
  {
    Tensor a = Tensor::Zeros({numel}, DType::kFloat32);
    Tensor b = Tensor::Zeros({numel}, DType::kFloat32);
    const double s = Seconds(
        [&] { std::memcpy(b.raw_data(), a.raw_data(), a.nbytes()); }, iters);
    std::printf("memcpy fp32 %lld elements: %.2f ms, %.1f GB/s (read+write)\n",
                static_cast<long long>(numel), s * 1e3,
                2.0 * a.nbytes() / s / 1e9);
  }
  for (OptimizerType type : {OptimizerType::kAdam, OptimizerType::kSgd}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      ParameterList params;
      for (int i = 0; i < 8; ++i) {
        auto p = std::make_shared<Parameter>();
        p->name = "p" + std::to_string(i);
        p->value = Tensor::Full({numel / 8}, 0.01, dtype);
        p->main_grad = Tensor::Full({numel / 8}, 0.001, DType::kFloat32);
        p->global_shape = p->value.shape();
        params.push_back(p);
      }
      OptimizerConfig cfg;
      cfg.type = type;
      cfg.clip_grad = 1.0;
      auto opt = *Optimizer::Create(params, cfg, {});
      const double s = Seconds([&] { (void)opt->Step(1e-4); }, iters);
      // Bytes touched: grad read twice (norm, update), fp32 master r/w,
      // state r/w, 16-bit copy written.
      const double state = type == OptimizerType::kAdam ? 2 : 1;
      const double bytes_per =
          4 * 2 + 8 + 8 * state + (dtype == DType::kBFloat16 ? 2 : 0);
      std::printf(
          "%s %s: %.2f ms per step, %.0f M params/s, %.1f GB/s effective\n",
          type == OptimizerType::kAdam ? "AdamW" : "SGD(momentum)",
          std::string(DTypeName(dtype)).c_str(), s * 1e3, numel / s / 1e6,
          bytes_per * numel / s / 1e9);
    }
  }
}

}  // namespace
}  // namespace optim
}  // namespace mcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  mcc::optim::Run();
  return 0;
}
