#include "core/ops/bench_nn.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/gemm.h"
#include "core/ops/norm.h"
#include "core/ops/rotary.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

bool g_cpu_time = false;

double Now() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  }
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Best seconds per call over a few timed repetitions after one warm-up.
double Time(const std::function<void()>& fn, int reps = 5) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = Now();
    fn();
    best = std::min(best, Now() - t0);
  }
  return best;
}

Tensor Random(const Shape& shape, DType dtype) {
  Tensor t = Tensor::Empty(shape, DType::kFloat32);
  float* p = t.data<float>();
  uint32_t s = 12345;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = static_cast<float>(s >> 8) / 16777216.0f * 2.0f - 1.0f;
  }
  return dtype == DType::kFloat32 ? t : t.To(dtype).value();
}

void Line(const char* name, const char* size, double sec, double amount,
          const char* unit) {
  std::printf("  %-34s %-26s %9.3f ms %9.1f %s\n", name, size, sec * 1e3,
              amount / sec / 1e9, unit);
}

}  // namespace

void SetNnBenchmarkCpuTime(bool cpu_time) { g_cpu_time = cpu_time; }

void RunAttentionBenchmarks(bool quick) {
  AttentionBenchmarkOptions options;
  options.quick = quick;
  RunAttentionBenchmarks(options);
}

void RunAttentionBenchmarks(const AttentionBenchmarkOptions& options) {
  const bool quick = options.quick;
  const bool one_shape = options.d > 0;
  const int reps = std::max(1, options.reps);
  // Flash attention, causal. bf16 runs on both CPU paths where the CPU has
  // AVX512-BF16 (the dot-product kernels, then the widened ones), so their
  // times and the fp32 time come from one run.
  const bool bf16_dot =
      CpuBf16AttentionPathInUse() == CpuBf16AttentionPath::kDotProduct;
  struct AttentionVariant {
    DType dtype;
    CpuBf16AttentionPath path;
    const char* label;
  };
  std::vector<AttentionVariant> variants = {
      {DType::kFloat32, CpuBf16AttentionPath::kWidened, "fp32"}};
  if (bf16_dot) {
    variants.push_back(
        {DType::kBFloat16, CpuBf16AttentionPath::kDotProduct, "bf16 dot"});
  }
  variants.push_back({DType::kBFloat16, CpuBf16AttentionPath::kWidened,
                      bf16_dot ? "bf16 widened" : "bf16"});
  variants.push_back({DType::kFloat16, CpuBf16AttentionPath::kWidened, "fp16"});
  const std::vector<int64_t> head_dims = one_shape
                                             ? std::vector<int64_t>{options.d}
                                             : std::vector<int64_t>{64, 128};
  for (int64_t d : head_dims) {
    const int64_t b = one_shape ? options.b
                      : quick   ? 1
                                : 2,
                  s = one_shape ? options.s
                      : quick   ? 512
                                : 2048,
                  h = one_shape ? options.h
                      : quick   ? 2
                                : 8;
    for (const AttentionVariant& variant : variants) {
      if (!options.only.empty() && options.only != variant.label) continue;
      const DType dt = variant.dtype;
      const CpuBf16AttentionPath saved_path =
          internal::SetCpuBf16AttentionPathForTesting(variant.path);
      const Shape shape = {b, s, h, d};
      Tensor q = Random(shape, dt), k = Random(shape, dt),
             v = Random(shape, dt);
      Tensor dout = Random(shape, dt);
      Tensor out = Tensor::Empty(shape, dt),
             lse = Tensor::Empty({b, h, s}, DType::kFloat32);
      Tensor dq = Tensor::Empty(shape, dt), dk = Tensor::Empty(shape, dt),
             dv = Tensor::Empty(shape, dt);
      char size[64];
      std::snprintf(size, sizeof(size), "b%lld s%lld h%lld d%lld %s",
                    static_cast<long long>(b), static_cast<long long>(s),
                    static_cast<long long>(h), static_cast<long long>(d),
                    variant.label);
      Line("FlashAttentionForward (causal)", size,
           Time(
               [&] {
                 MCC_CHECK_OK(FlashAttentionForward(q, k, v, {}, &out, &lse));
               },
               reps),
           FlashAttentionForwardFlops(b, s, h, d, true), "GFLOP/s");
      Line("FlashAttentionBackward (causal)", size,
           Time(
               [&] {
                 MCC_CHECK_OK(FlashAttentionBackward(q, k, v, out, dout, lse,
                                                     {}, &dq, &dk, &dv));
               },
               reps),
           FlashAttentionBackwardFlops(b, s, h, d, true), "GFLOP/s");
      internal::SetCpuBf16AttentionPathForTesting(saved_path);
    }
  }
  if (one_shape || !options.only.empty()) return;
  // Packed documents (AttentionOptions::first_key): the same problem cut
  // into documents of n tokens. Blocks across documents are skipped, so the
  // time falls with n against the full causal line (n = s); GFLOP/s counts
  // the documents' own causal FLOPs.
  {
    const int64_t b = quick ? 1 : 2, s = quick ? 512 : 2048, h = quick ? 2 : 8,
                  d = 128;
    const Shape shape = {b, s, h, d};
    Tensor q = Random(shape, DType::kFloat32),
           k = Random(shape, DType::kFloat32),
           v = Random(shape, DType::kFloat32),
           dout = Random(shape, DType::kFloat32);
    Tensor out = Tensor::Empty(shape, DType::kFloat32),
           lse = Tensor::Empty({b, h, s}, DType::kFloat32);
    Tensor dq = Tensor::Empty(shape, DType::kFloat32),
           dk = Tensor::Empty(shape, DType::kFloat32),
           dv = Tensor::Empty(shape, DType::kFloat32);
    for (int64_t n : {s, s / 4, s / 16}) {
      AttentionOptions options;
      if (n < s) {
        options.first_key = Tensor::Empty({b, s}, DType::kInt32);
        int32_t* f = options.first_key.data<int32_t>();
        for (int64_t i = 0; i < b * s; ++i) f[i] = (i % s) / n * n;
      }
      char size[64];
      std::snprintf(size, sizeof(size), "b%lld s%lld h%lld d%lld docs of %lld",
                    static_cast<long long>(b), static_cast<long long>(s),
                    static_cast<long long>(h), static_cast<long long>(d),
                    static_cast<long long>(n));
      const double docs = static_cast<double>(s / n);
      Line(n < s ? "FlashAttentionForward (documents)"
                 : "FlashAttentionForward (causal)",
           size,
           Time(
               [&] {
                 MCC_CHECK_OK(
                     FlashAttentionForward(q, k, v, options, &out, &lse));
               },
               3),
           docs * FlashAttentionForwardFlops(b, n, h, d, true), "GFLOP/s");
      Line(n < s ? "FlashAttentionBackward (documents)"
                 : "FlashAttentionBackward (causal)",
           size,
           Time(
               [&] {
                 MCC_CHECK_OK(FlashAttentionBackward(q, k, v, out, dout, lse,
                                                     options, &dq, &dk, &dv));
               },
               3),
           docs * FlashAttentionBackwardFlops(b, n, h, d, true), "GFLOP/s");
    }
  }
}

void RunNnBenchmarks(bool quick) {
  std::printf("transformer kernels (%d threads)\n",
              ThreadPool::Global().num_threads());
  // Baselines: memcpy bandwidth (read + write) and an fp32 GEMM.
  {
    const size_t bytes = quick ? (16u << 20) : (128u << 20);
    std::vector<char> a(bytes, 1), b(bytes, 0);
    const double t = Time([&] { std::memcpy(b.data(), a.data(), bytes); });
    Line("memcpy (read+write)", quick ? "16 MiB" : "128 MiB", t, 2.0 * bytes,
         "GB/s");
    const int64_t n = quick ? 256 : 1024;
    Tensor x = Random({n, n}, DType::kFloat32),
           y = Random({n, n}, DType::kFloat32);
    Tensor z = Tensor::Empty({n, n}, DType::kFloat32);
    const double tg = Time([&] {
      GemmF32(false, false, n, n, n, 1.0f, x.data<float>(), n, y.data<float>(),
              n, 0.0f, z.data<float>(), n);
    });
    Line("GemmF32 (oneDNN)", quick ? "256^3" : "1024^3", tg, 2.0 * n * n * n,
         "GFLOP/s");
  }
  // Norms: rows x hidden; bytes moved = inputs read + outputs written.
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const int64_t rows = quick ? 256 : 4096, h = 4096;
    const double e = static_cast<double>(DTypeSize(dt));
    const std::string size_s = "[4096, 4096] " + std::string(DTypeName(dt));
    const char* size = size_s.c_str();
    Tensor x = Random({rows, h}, dt), dy = Random({rows, h}, dt);
    Tensor g = Random({h}, DType::kFloat32), b = Random({h}, DType::kFloat32);
    Tensor y = Tensor::Empty({rows, h}, dt), dx = Tensor::Empty({rows, h}, dt);
    Tensor mean = Tensor::Empty({rows}, DType::kFloat32);
    Tensor rstd = Tensor::Empty({rows}, DType::kFloat32);
    Tensor dg = Tensor::Zeros({h}, DType::kFloat32),
           db = Tensor::Zeros({h}, DType::kFloat32);
    const double n = static_cast<double>(rows * h);
    Line("LayerNormForward", size, Time([&] {
           MCC_CHECK_OK(LayerNormForward(x, g, b, 1e-5f, &y, &mean, &rstd));
         }),
         2 * n * e, "GB/s");
    Line("LayerNormBackward", size, Time([&] {
           MCC_CHECK_OK(LayerNormBackward(dy, x, g, mean, rstd, &dx, &dg, &db));
         }),
         3 * n * e, "GB/s");
    Line("RMSNormForward", size,
         Time([&] { MCC_CHECK_OK(RMSNormForward(x, g, 1e-5f, &y, &rstd)); }),
         2 * n * e, "GB/s");
    Line("RMSNormBackward", size,
         Time([&] { MCC_CHECK_OK(RMSNormBackward(dy, x, g, rstd, &dx, &dg)); }),
         3 * n * e, "GB/s");
  }
  // Rotary on [b, s, h, d].
  {
    const Shape shape = {quick ? 1 : 4, 1024, 32, 128};
    Tensor x = Random(shape, DType::kFloat32);
    Tensor y = Tensor::Empty(shape, DType::kFloat32);
    const double n = static_cast<double>(x.numel());
    Line("RotaryForward", "[4, 1024, 32, 128] fp32",
         Time([&] { MCC_CHECK_OK(RotaryForward(x, {}, &y)); }), 8 * n, "GB/s");
    Line("RotaryBackward", "[4, 1024, 32, 128] fp32",
         Time([&] { MCC_CHECK_OK(RotaryBackward(x, {}, &y)); }), 8 * n, "GB/s");
  }
  RunAttentionBenchmarks(quick);
  // Cross entropy over a GPT-2-sized (padded) vocabulary.
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const int64_t tokens = quick ? 64 : 512, vocab = 50304;
    Tensor logits = Random({tokens, vocab}, dt);
    std::vector<int64_t> t(tokens);
    for (int64_t i = 0; i < tokens; ++i) t[i] = (i * 7919) % vocab;
    Tensor targets = Tensor::FromInts(t, {tokens}).value();
    Tensor loss = Tensor::Empty({tokens}, DType::kFloat32);
    Tensor lse = Tensor::Empty({tokens}, DType::kFloat32);
    Tensor dloss = Tensor::Full({tokens}, 1.0 / tokens, DType::kFloat32);
    Tensor dlogits = Tensor::Empty({tokens, vocab}, dt);
    const double n = static_cast<double>(tokens * vocab) * DTypeSize(dt);
    const std::string size_s = "[512, 50304] " + std::string(DTypeName(dt));
    const char* size = size_s.c_str();
    Line("CrossEntropyForward", size, Time([&] {
           MCC_CHECK_OK(CrossEntropyForward(logits, targets, &loss, &lse));
         }),
         n, "GB/s");
    Line("CrossEntropyBackward", size, Time([&] {
           MCC_CHECK_OK(
               CrossEntropyBackward(logits, targets, lse, dloss, &dlogits));
         }),
         2 * n, "GB/s");
  }
}

}  // namespace ops
}  // namespace mcc
