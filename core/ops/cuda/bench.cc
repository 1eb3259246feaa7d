// GPU benchmark of the registered CUDA kernels, called through the dispatch
// ops as library code calls them: GEMM TFLOP/s through ops::Gemm beside a
// direct cublasGemmEx call, and GB/s of the memory-bound kernels beside a
// device-to-device cudaMemcpy, and flash-attention TFLOP/s (forward and
// backward) beside the bf16 cuBLAS GEMM rate of the same run (bf16 rows
// add the SIMT forward and backward, FlashAttentionArgs::tensor_cores off,
// and the tensor-core kernels' speed-ups over them). Prints "no CUDA device"
// and exits 0 without a GPU.
//
//   bench [--iters=20] [--gemm=true] [--memory=true] [--attention=true]
//         [--mem_elements=67108864]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/event.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/ops/activation.h"
#include "core/ops/adamw.h"
#include "core/ops/attention.h"
#include "core/ops/bias.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/cuda/cublas_library.h"
#include "core/ops/cuda/flash_attention.h"
#include "core/ops/cuda/gemm.h"
#include "core/ops/elementwise.h"
#include "core/ops/gemm.h"
#include "core/ops/norm.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

ABSL_FLAG(int, iters, 20, "timed iterations per measurement");
ABSL_FLAG(bool, gemm, true, "run the GEMM benchmarks");
ABSL_FLAG(bool, memory, true, "run the memory-bound kernel benchmarks");
ABSL_FLAG(bool, attention, true, "run the flash-attention benchmarks");
ABSL_FLAG(int64_t, mem_elements, int64_t{1} << 26,
          "elements per tensor in the memory-bound benchmarks");

namespace mcc {
namespace {

namespace oc = ::mcc::ops::cuda;

const Device kGpu = Device::CUDA(0);

// Mean milliseconds of fn over --iters runs after two warm-up runs.
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

Tensor Random(const Shape& shape, DType dtype, float lo = -1.0f,
              float hi = 1.0f) {
  // Deterministic pseudo-random values built on the host, then copied.
  const int64_t n = NumElements(shape);
  std::vector<float> v(n);
  uint32_t s = 12345;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = lo + (hi - lo) * ((s >> 8) * (1.0f / 16777216.0f));
  }
  return *Tensor::FromVector(v, shape, dtype)->To(kGpu);
}

struct GemmShape {
  const char* name;
  int64_t m, n, k;
};

void BenchGemm() {
  const std::vector<GemmShape> shapes = {
      {"square", 4096, 4096, 4096},
      {"qkv (8192 tok, h4096)", 8192, 12288, 4096},
      {"attn-out", 8192, 4096, 4096},
      {"mlp-up", 8192, 16384, 4096},
      {"mlp-down", 8192, 4096, 16384},
  };
  struct Kind {
    const char* name;
    DType dtype;
  };
  const Kind kinds[] = {{"fp32", DType::kFloat32}, {"bf16", DType::kBFloat16}};
  std::printf("%-24s %-5s %-20s %12s %12s\n", "gemm", "type", "MxNxK",
              "ops TF/s", "cublas TF/s");
  cublasHandle_t handle = *oc::CublasHandle(0);
  for (const GemmShape& g : shapes) {
    for (const Kind& kind : kinds) {
      Tensor a = Random({g.m, g.k}, kind.dtype);
      Tensor b = Random({g.k, g.n}, kind.dtype);
      Tensor c = Tensor::Empty({g.m, g.n}, kind.dtype, kGpu);
      const double ours =
          TimeMs([&] { MCC_CHECK_OK(ops::Gemm(a, false, b, false, &c)); });
      const cudaDataType_t t =
          kind.dtype == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
      const float alpha = 1.0f, beta = 0.0f;
      const double direct = TimeMs([&] {
        MCC_CHECK_OK(oc::CublasToStatus(
            oc::Cublas().cublasGemmEx(
                handle, CUBLAS_OP_N, CUBLAS_OP_N, g.n, g.m, g.k, &alpha,
                b.raw_data(), t, g.n, a.raw_data(), t, g.k, &beta, c.raw_data(),
                t, g.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx"));
      });
      const double flops = 2.0 * g.m * g.n * g.k;
      std::printf("%-24s %-5s %-20s %12.1f %12.1f\n", g.name, kind.name,
                  absl::StrFormat("%dx%dx%d", g.m, g.n, g.k).c_str(),
                  flops / ours / 1e9, flops / direct / 1e9);
      std::fflush(stdout);
    }
  }
}

// TFLOP/s of one bf16 4096^3 cublasGemmEx (fp32 accumulation): the dense
// rate the attention rows are set against.
double CublasBf16Tflops() {
  const int64_t n = 4096;
  Tensor a = Random({n, n}, DType::kBFloat16);
  Tensor b = Random({n, n}, DType::kBFloat16);
  Tensor c = Tensor::Empty({n, n}, DType::kBFloat16, kGpu);
  cublasHandle_t handle = *oc::CublasHandle(0);
  const float alpha = 1.0f, beta = 0.0f;
  const double ms = TimeMs([&] {
    MCC_CHECK_OK(oc::CublasToStatus(
        oc::Cublas().cublasGemmEx(
            handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, b.raw_data(),
            CUDA_R_16BF, n, a.raw_data(), CUDA_R_16BF, n, &beta, c.raw_data(),
            CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx"));
  });
  return 2.0 * n * n * n / ms / 1e9;
}

struct AttentionShape {
  const char* name;
  int64_t b, s, heads, kv_heads, d;
  bool causal;
  DType dtype;
};

// Flash attention through ops::FlashAttentionForward/Backward: useful
// TFLOP/s (core/ops/attention.h's counts: causal counts the lower triangle)
// and the share of the bf16 cuBLAS rate.
void BenchAttention() {
  const double peak = CublasBf16Tflops();
  std::printf("cuBLAS bf16 GEMM 4096^3: %.1f TFLOP/s (reference below)\n",
              peak);
  const AttentionShape shapes[] = {
      {"gpt2-124M (12h, d64)", 8, 1024, 12, 12, 64, true, DType::kBFloat16},
      {"llama gqa (32/8h, d128)", 2, 4096, 32, 8, 128, true, DType::kBFloat16},
      {"d128 full", 2, 2048, 16, 16, 128, false, DType::kBFloat16},
      {"gpt2-124M fp32", 8, 1024, 12, 12, 64, true, DType::kFloat32},
  };
  std::printf("%-26s %-5s %-22s %9s %9s %6s %9s %9s %6s\n", "attention", "type",
              "b x s x h/hkv x d", "fwd ms", "fwd TF/s", "%peak", "bwd ms",
              "bwd TF/s", "%peak");
  for (const AttentionShape& a : shapes) {
    Tensor q = Random({a.b, a.s, a.heads, a.d}, a.dtype);
    Tensor k = Random({a.b, a.s, a.kv_heads, a.d}, a.dtype);
    Tensor v = Random({a.b, a.s, a.kv_heads, a.d}, a.dtype);
    Tensor dout = Random({a.b, a.s, a.heads, a.d}, a.dtype);
    Tensor out = Tensor::Empty(q.shape(), a.dtype, kGpu);
    Tensor lse = Tensor::Empty({a.b, a.heads, a.s}, DType::kFloat32, kGpu);
    Tensor dq = Tensor::Empty(q.shape(), a.dtype, kGpu);
    Tensor dk = Tensor::Empty(k.shape(), a.dtype, kGpu);
    Tensor dv = Tensor::Empty(v.shape(), a.dtype, kGpu);
    ops::AttentionOptions o;
    o.causal = a.causal;
    const double fwd = TimeMs([&] {
      MCC_CHECK_OK(ops::FlashAttentionForward(q, k, v, o, &out, &lse));
    });
    const double bwd = TimeMs([&] {
      MCC_CHECK_OK(ops::FlashAttentionBackward(q, k, v, out, dout, lse, o, &dq,
                                               &dk, &dv));
    });
    const double ff =
        ops::FlashAttentionForwardFlops(a.b, a.s, a.heads, a.d, a.causal);
    const double bf =
        ops::FlashAttentionBackwardFlops(a.b, a.s, a.heads, a.d, a.causal);
    const double ft = ff / fwd / 1e9, bt = bf / bwd / 1e9;
    std::printf(
        "%-26s %-5s %-22s %9.3f %9.1f %5.1f%% %9.3f %9.1f %5.1f%%\n", a.name,
        a.dtype == DType::kFloat32 ? "fp32" : "bf16",
        absl::StrFormat("%dx%dx%d/%dx%d", a.b, a.s, a.heads, a.kv_heads, a.d)
            .c_str(),
        fwd, ft, 100 * ft / peak, bwd, bt, 100 * bt / peak);
    if (a.dtype != DType::kFloat32) {
      // The same forward and backward on the SIMT kernels (the ones before
      // the tensor-core kernels, and the ones older GPUs run).
      cuda_kernels::FlashAttentionArgs args;
      args.batch = a.b;
      args.seq = a.s;
      args.heads = a.heads;
      args.kv_heads = a.kv_heads;
      args.head_dim = a.d;
      args.scale = 1.0f / std::sqrt(static_cast<float>(a.d));
      args.causal = a.causal;
      args.tensor_cores = false;
      const cudaStream_t stream = cuda::CurrentStream(0);
      const double simt = TimeMs([&] {
        MCC_CHECK_OK(cuda::CudaErrorToStatus(
            cuda_kernels::FlashAttentionForward(
                args, q.raw_data(), k.raw_data(), v.raw_data(),
                cuda_kernels::ElemType::kBF16, out.raw_data(),
                cuda_kernels::ElemType::kBF16,
                static_cast<float*>(lse.raw_data()), stream),
            "FlashAttentionForward (SIMT)", __FILE__, __LINE__));
      });
      Tensor row_dot =
          Tensor::Empty({a.b, a.heads, a.s}, DType::kFloat32, kGpu);
      const double simt_bwd = TimeMs([&] {
        MCC_CHECK_OK(cuda::CudaErrorToStatus(
            cuda_kernels::FlashAttentionBackward(
                args, q.raw_data(), k.raw_data(), v.raw_data(),
                cuda_kernels::ElemType::kBF16, out.raw_data(), dout.raw_data(),
                cuda_kernels::ElemType::kBF16,
                static_cast<const float*>(lse.raw_data()), dq.raw_data(),
                cuda_kernels::ElemType::kBF16, dk.raw_data(), dv.raw_data(),
                cuda_kernels::ElemType::kBF16,
                static_cast<float*>(row_dot.raw_data()), stream),
            "FlashAttentionBackward (SIMT)", __FILE__, __LINE__));
      });
      std::printf(
          "%-26s %-5s %-22s %9.3f %9.1f %5.1f%% %9.3f %9.1f %5.1f%%  (SIMT; "
          "the row above is %.2fx / %.2fx it)\n",
          "", "", "", simt, ff / simt / 1e9, 100 * ff / simt / 1e9 / peak,
          simt_bwd, bf / simt_bwd / 1e9, 100 * bf / simt_bwd / 1e9 / peak,
          simt / fwd, simt_bwd / bwd);
    }
    std::fflush(stdout);
  }
  MCC_CHECK_OK(cuda::Synchronize(0));
}

void Report(const char* name, double bytes, double ms) {
  std::printf("%-34s %10.3f ms %10.1f GB/s\n", name, ms, bytes / ms / 1e6);
  std::fflush(stdout);
}

void BenchMemory() {
  const int64_t n = absl::GetFlag(FLAGS_mem_elements);
  const int64_t cols = 4096, rows = n / cols;
  std::printf(
      "memory-bound kernels, %lld elements (%lld x %lld), bytes = minimal "
      "traffic\n",
      static_cast<long long>(rows * cols), static_cast<long long>(rows),
      static_cast<long long>(cols));
  const double e = static_cast<double>(rows * cols);
  const Shape shape = {rows, cols};
  Tensor x32 = Random(shape, DType::kFloat32);
  Tensor y32 = Tensor::Empty(shape, DType::kFloat32, kGpu);
  Report(
      "cudaMemcpy D2D fp32", 8 * e, TimeMs([&] {
        MCC_CUDA_CHECK(cudaMemcpyAsync(y32.raw_data(), x32.raw_data(),
                                       x32.nbytes(), cudaMemcpyDeviceToDevice));
      }));
  Tensor x16 = Random(shape, DType::kBFloat16);
  Tensor y16 = Tensor::Empty(shape, DType::kBFloat16, kGpu);
  Tensor dy32 = Random(shape, DType::kFloat32);
  Tensor dy16 = Random(shape, DType::kBFloat16);
  Report("gelu fwd fp32", 8 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::Gelu(x32, &y32)); }));
  Report("gelu fwd bf16", 4 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::Gelu(x16, &y16)); }));
  Report("gelu bwd fp32", 12 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::GeluBackward(dy32, x32, &y32)); }));
  Report("gelu bwd bf16", 6 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::GeluBackward(dy16, x16, &y16)); }));
  Tensor b32 = Random({cols}, DType::kFloat32);
  Tensor b16 = Random({cols}, DType::kBFloat16);
  Tensor db = Tensor::Zeros({cols}, DType::kFloat32, kGpu);
  Report("bias add fp32", 8 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::BiasAdd(x32, b32, &y32)); }));
  Report("bias add bf16", 4 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::BiasAdd(x16, b16, &y16)); }));
  Report("bias grad fp32", 4 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::BiasAddBackward(dy32, &db)); }));
  Report("bias grad bf16", 2 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::BiasAddBackward(dy16, &db)); }));
  Report("convert fp32->bf16", 6 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::Convert(x32, &y16)); }));
  Report("convert bf16->fp32", 6 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::Convert(x16, &y32)); }));
  Report("fill fp32", 4 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::Fill(1.5, &y32)); }));
  Report("accumulate bf16 -> fp32", 10 * e,
         TimeMs([&] { MCC_CHECK_OK(ops::Accumulate(x16, 0.5f, &y32)); }));
  {
    Tensor p = Random({rows * cols}, DType::kFloat32);
    Tensor g = Random({rows * cols}, DType::kFloat32);
    Tensor m = Tensor::Zeros({rows * cols}, DType::kFloat32, kGpu);
    Tensor v = Tensor::Zeros({rows * cols}, DType::kFloat32, kGpu);
    Tensor p16 = Tensor::Empty({rows * cols}, DType::kBFloat16, kGpu);
    ops::AdamWConfig config;
    Report("adamw fp32 (+bf16 copy)", 30 * e, TimeMs([&] {
             ++config.step;
             MCC_CHECK_OK(ops::AdamWStep(config, g, &p, &m, &v, &p16));
           }));
  }
  Tensor gamma = Random({cols}, DType::kFloat32, 0.5f, 1.5f);
  Tensor beta = Random({cols}, DType::kFloat32);
  Tensor mean = Tensor::Empty({rows}, DType::kFloat32, kGpu);
  Tensor rstd = Tensor::Empty({rows}, DType::kFloat32, kGpu);
  Tensor dgamma = Tensor::Zeros({cols}, DType::kFloat32, kGpu);
  Tensor dbeta = Tensor::Zeros({cols}, DType::kFloat32, kGpu);
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor& x = dt == DType::kFloat32 ? x32 : x16;
    const Tensor& dy = dt == DType::kFloat32 ? dy32 : dy16;
    Tensor& y = dt == DType::kFloat32 ? y32 : y16;
    const double s = static_cast<double>(DTypeSize(dt));
    MCC_CHECK_OK(
        ops::LayerNormForward(x, gamma, beta, 1e-5f, &y, &mean, &rstd));
    Report(dt == DType::kFloat32 ? "layernorm fwd fp32" : "layernorm fwd bf16",
           2 * s * e, TimeMs([&] {
             MCC_CHECK_OK(ops::LayerNormForward(x, gamma, beta, 1e-5f, &y,
                                                &mean, &rstd));
           }));
    Report(dt == DType::kFloat32 ? "layernorm bwd fp32" : "layernorm bwd bf16",
           3 * s * e, TimeMs([&] {
             MCC_CHECK_OK(ops::LayerNormBackward(dy, x, gamma, mean, rstd, &y,
                                                 &dgamma, &dbeta));
           }));
  }
  {
    const int64_t vocab = 50304, tokens = std::max<int64_t>(1, n / vocab);
    Tensor logits = Random({tokens, vocab}, DType::kBFloat16, -5.0f, 5.0f);
    Tensor dlogits = Tensor::Empty({tokens, vocab}, DType::kBFloat16, kGpu);
    std::vector<int64_t> labels(tokens);
    for (int64_t i = 0; i < tokens; ++i) labels[i] = (i * 7919) % vocab;
    Tensor lab = *Tensor::FromInts(labels, {tokens})->To(kGpu);
    Tensor dloss = Tensor::Full({tokens}, 1.0 / tokens, DType::kFloat32, kGpu);
    Tensor loss = Tensor::Empty({tokens}, DType::kFloat32, kGpu);
    Tensor lse = Tensor::Empty({tokens}, DType::kFloat32, kGpu);
    const double le = static_cast<double>(tokens * vocab);
    Report("cross-entropy fwd bf16 (v=50304)", 2 * le, TimeMs([&] {
             MCC_CHECK_OK(ops::CrossEntropyForward(logits, lab, &loss, &lse));
           }));
    Report("cross-entropy bwd bf16 (v=50304)", 4 * le, TimeMs([&] {
             MCC_CHECK_OK(
                 ops::CrossEntropyBackward(logits, lab, lse, dloss, &dlogits));
           }));
  }
  MCC_CHECK_OK(cuda::Synchronize(0));
}

}  // namespace
}  // namespace mcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (mcc::cuda::CudaDeviceCount() == 0) {
    std::printf("no CUDA device: bench skipped\n");
    return 0;
  }
  std::printf("device: %s\n", mcc::cuda::DeviceDescription(0)->c_str());
  if (absl::GetFlag(FLAGS_gemm)) mcc::BenchGemm();
  if (absl::GetFlag(FLAGS_memory)) mcc::BenchMemory();
  if (absl::GetFlag(FLAGS_attention)) mcc::BenchAttention();
  return 0;
}
