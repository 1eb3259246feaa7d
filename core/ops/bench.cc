// Benchmarks of the CPU kernels: GEMM GFLOP/s at transformer shapes beside
// the raw oneDNN call, and GB/s of the memory-bound kernels beside memcpy,
// all measured in the same run.
//
//   tools/bazel run //core/ops:bench                      # table
//   tools/bazel run //core/ops:bench -- --format=json     # JSON lines
//   MCC_NUM_THREADS=1 OMP_NUM_THREADS=1 bazel-bin/core/ops/bench --cpu_time
//       --filter=gemm.   # process CPU time (a shared machine), GEMMs only
//
// JSON lines carry name, dtype, shape, value, unit; the raw references are
// lines of their own (names ending in ".raw" and "memcpy").

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/ops/activation.h"
#include "core/ops/adamw.h"
#include "core/ops/bias.h"
#include "core/ops/dropout.h"
#include "core/ops/embedding.h"
#include "core/ops/gemm.h"
#include "core/ops/kernel_util.h"
#include "core/ops/layout.h"
#include "core/ops/reduce.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "dnnl.h"
#include "dnnl.hpp"
#include "glog/logging.h"

ABSL_FLAG(std::string, format, "table", "table or json");
ABSL_FLAG(std::string, filter, "",
          "Only cases whose name contains this substring (memcpy always runs)");
ABSL_FLAG(double, min_seconds, 0.25,
          "Minimum measuring time per case (at least 3 repetitions)");
ABSL_FLAG(bool, cpu_time, false,
          "Time by the process's CPU time (all threads) instead of wall time: "
          "on a machine shared with other work, wall time counts the moments "
          "other processes hold the cores");

namespace mcc {
namespace ops {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds on the clock the benchmark reads (--cpu_time: process CPU time).
double Now() {
  if (absl::GetFlag(FLAGS_cpu_time)) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  }
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

struct Row {
  std::string name, dtype, shape;
  double value;
  std::string unit;
  std::string versus;  // Reference row's name, for the ratio column.
  double ratio = 0;
};

std::vector<Row> g_rows;

// Best time in seconds of fn over repetitions (after one warm-up).
double BestTime(const std::function<void()>& fn) {
  fn();
  double best = 1e30, total = 0;
  int reps = 0;
  while (reps < 3 || total < absl::GetFlag(FLAGS_min_seconds)) {
    const double t0 = Now();
    fn();
    const double s = Now() - t0;
    best = std::min(best, s);
    total += s;
    ++reps;
  }
  return best;
}

// Times a and b alternately (so both see the same machine load); returns
// best times.
std::pair<double, double> BestTimes(const std::function<void()>& a,
                                    const std::function<void()>& b) {
  a();
  b();
  double ba = 1e30, bb = 1e30, total = 0;
  int reps = 0;
  while (reps < 3 || total < 2 * absl::GetFlag(FLAGS_min_seconds)) {
    double t0 = Now();
    a();
    const double sa = Now() - t0;
    t0 = Now();
    b();
    const double sb = Now() - t0;
    ba = std::min(ba, sa);
    bb = std::min(bb, sb);
    total += sa + sb;
    ++reps;
  }
  return {ba, bb};
}

void Check(const absl::Status& s) { CHECK(s.ok()) << s; }

bool Selected(const std::string& name) {
  return name.find(absl::GetFlag(FLAGS_filter)) != std::string::npos;
}

// ---- GEMM ----------------------------------------------------------------

struct GemmCase {
  const char* name;
  bool ta, tb;
  int64_t m, n, k;
  float beta;
};

// Raw oneDNN bf16 matmul (only where the CPU runs bf16 natively).
class RawBf16Matmul {
 public:
  RawBf16Matmul(const GemmCase& g, const Tensor& a, const Tensor& b, Tensor* c)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    using dims = dnnl::memory::dims;
    using dt = dnnl::memory::data_type;
    const int64_t lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
    dnnl::memory::desc a_md({g.m, g.k}, dt::bf16,
                            g.ta ? dims{1, lda} : dims{lda, 1});
    dnnl::memory::desc b_md({g.k, g.n}, dt::bf16,
                            g.tb ? dims{1, ldb} : dims{ldb, 1});
    dnnl::memory::desc c_md({g.m, g.n}, dt::f32, dims{g.n, 1});
    dnnl::primitive_attr attr;
    if (g.beta != 0) {
      dnnl::post_ops po;
      po.append_sum(g.beta);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr,
                                    engine_);
    prim_ = dnnl::matmul(pd);
    am_ = dnnl::memory(a_md, engine_, a.raw_data());
    bm_ = dnnl::memory(b_md, engine_, b.raw_data());
    cm_ = dnnl::memory(c_md, engine_, c->raw_data());
  }
  void Run() {
    prim_.execute(
        stream_,
        {{DNNL_ARG_SRC, am_}, {DNNL_ARG_WEIGHTS, bm_}, {DNNL_ARG_DST, cm_}});
    stream_.wait();
  }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::matmul prim_;
  dnnl::memory am_, bm_, cm_;
};

void BenchGemm(const GemmCase& g) {
  if (!Selected(absl::StrCat("gemm.", g.name))) return;
  const Shape a_shape = g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k};
  const Shape b_shape = g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n};
  const double flops = 2.0 * g.m * g.n * g.k;
  const std::string shape =
      absl::StrFormat("m=%d n=%d k=%d %c%c%s", g.m, g.n, g.k, g.ta ? 'T' : 'N',
                      g.tb ? 'T' : 'N', g.beta != 0 ? " beta=1" : "");
  Tensor a32 = Tensor::Full(a_shape, 0.01, DType::kFloat32);
  Tensor b32 = Tensor::Full(b_shape, 0.02, DType::kFloat32);
  Tensor c = Tensor::Zeros({g.m, g.n}, DType::kFloat32);
  const int64_t lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
  const int threads = ThreadPool::Global().num_threads();
  auto raw_sgemm = [&] {
    omp_set_num_threads(threads);
    CHECK_EQ(dnnl_sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.m, g.n, g.k, 1.0f,
                        a32.data<float>(), lda, b32.data<float>(), ldb, g.beta,
                        c.data<float>(), g.n),
             dnnl_success);
  };
  auto ours32 = [&] { Check(Gemm(a32, g.ta, b32, g.tb, &c, 1.0f, g.beta)); };
  auto [t_ours, t_raw] = BestTimes(ours32, raw_sgemm);
  const std::string raw_name = absl::StrCat("gemm.", g.name, ".raw");
  g_rows.push_back(
      {raw_name, "fp32", shape, flops / t_raw / 1e9, "GFLOP/s", "dnnl_sgemm"});
  g_rows.push_back({absl::StrCat("gemm.", g.name), "fp32", shape,
                    flops / t_ours / 1e9, "GFLOP/s", raw_name, t_raw / t_ours});
  {
    // oneDNN's matmul primitive (brgemm kernels) on the same fp32 operands.
    const bool saved = internal::SetForceMatmulPrimitiveForTesting(true);
    auto [t_matmul, t_raw2] = BestTimes(ours32, raw_sgemm);
    internal::SetForceMatmulPrimitiveForTesting(saved);
    g_rows.push_back({absl::StrCat("gemm.", g.name, ".matmul"), "fp32", shape,
                      flops / t_matmul / 1e9, "GFLOP/s", raw_name,
                      t_raw2 / t_matmul});
  }

  // bf16: each path alone (pinned), then the automatic choice. The
  // reference is the faster raw call: oneDNN's bf16 matmul where the CPU
  // has one, else sgemm on fp32 copies (what the widened path runs).
  Tensor a16 = a32.To(DType::kBFloat16).value();
  Tensor b16 = b32.To(DType::kBFloat16).value();
  auto ours16 = [&] { Check(Gemm(a16, g.ta, b16, g.tb, &c, 1.0f, g.beta)); };
  auto pinned = [&](Bf16PathPolicy policy) {
    const Bf16PathPolicy saved = internal::SetBf16PathPolicyForTesting(policy);
    auto [t_ours, t_ref] = BestTimes(ours16, raw_sgemm);
    internal::SetBf16PathPolicyForTesting(saved);
    return std::make_pair(t_ours, t_ref);
  };
  const std::string raw16_name = absl::StrCat("gemm.", g.name, ".raw");
  auto [t_wide, t_wide_raw] = pinned(Bf16PathPolicy::kWidened);
  double t_best_raw = t_wide_raw;
  std::string best_raw_what = "dnnl_sgemm on fp32 copies";
  g_rows.push_back({raw16_name, "bf16", shape, flops / t_wide_raw / 1e9,
                    "GFLOP/s", "dnnl_sgemm on fp32 copies"});
  g_rows.push_back({absl::StrCat("gemm.", g.name, ".widened"), "bf16", shape,
                    flops / t_wide / 1e9, "GFLOP/s", "sgemm on fp32 copies",
                    t_wide_raw / t_wide});
  if (NativeBf16Available()) {
    RawBf16Matmul raw(g, a16, b16, &c);
    const Bf16PathPolicy saved =
        internal::SetBf16PathPolicyForTesting(Bf16PathPolicy::kNative);
    auto [t_native, t_native_raw] = BestTimes(ours16, [&] {
      omp_set_num_threads(threads);
      raw.Run();
    });
    internal::SetBf16PathPolicyForTesting(saved);
    const std::string native_raw = absl::StrCat("gemm.", g.name, ".raw_native");
    g_rows.push_back(
        {native_raw, "bf16", shape, flops / t_native_raw / 1e9, "GFLOP/s",
         absl::StrCat("dnnl bf16 matmul (", NativeBf16Isa(), ")")});
    g_rows.push_back({absl::StrCat("gemm.", g.name, ".native"), "bf16", shape,
                      flops / t_native / 1e9, "GFLOP/s", native_raw,
                      t_native_raw / t_native});
    if (t_native_raw < t_best_raw) {
      t_best_raw = t_native_raw;
      best_raw_what = native_raw;
    } else {
      best_raw_what = raw16_name;
    }
  } else {
    best_raw_what = raw16_name;
  }
  // The automatic choice, measured on first use inside Gemm.
  const Bf16PathPolicy saved =
      internal::SetBf16PathPolicyForTesting(Bf16PathPolicy::kAuto);
  const double t_auto = BestTime(ours16);
  internal::SetBf16PathPolicyForTesting(saved);
  std::string chosen = "widened (no native bf16 or under 4 MFLOP)";
  for (const Bf16GemmChoice& ch : Bf16GemmChoices()) {
    if (ch.shape.m == g.m && ch.shape.n == g.n && ch.shape.k == g.k &&
        ch.shape.trans_a == g.ta && ch.shape.trans_b == g.tb) {
      chosen = GemmPathName(ch.path);
    }
  }
  g_rows.push_back({absl::StrCat("gemm.", g.name), "bf16", shape,
                    flops / t_auto / 1e9, "GFLOP/s",
                    absl::StrCat(best_raw_what, "; chose ", chosen),
                    t_best_raw / t_auto});

  // fp16 is always widened (F16C) and run as sgemm.
  Tensor a_h = a32.To(DType::kFloat16).value();
  Tensor b_h = b32.To(DType::kFloat16).value();
  auto ours_h = [&] { Check(Gemm(a_h, g.ta, b_h, g.tb, &c, 1.0f, g.beta)); };
  auto [t_h, t_h_raw] = BestTimes(ours_h, raw_sgemm);
  g_rows.push_back({raw16_name, "fp16", shape, flops / t_h_raw / 1e9, "GFLOP/s",
                    "dnnl_sgemm on fp32 copies"});
  g_rows.push_back({absl::StrCat("gemm.", g.name), "fp16", shape,
                    flops / t_h / 1e9, "GFLOP/s", raw16_name, t_h_raw / t_h});
}

// ---- GEMMs of one shape from several threads at once -----------------------

// Every core's thread runs the same shape through Gemm at once, one oneDNN
// thread each, beside the same GEMM on one thread alone: what a process whose
// threads share a cached primitive (the planner's probe, a server's workers)
// gets per thread. oneDNN's own scratchpad made that a third of the lone rate
// (two threads, bf16 2048 x 512 x 512: 120 against 370 GFLOP/s). Native bf16
// where the CPU has it, else fp32 through the same matmul-primitive path.
void BenchConcurrentGemm() {
  // Process CPU time would sum the threads' times.
  if (!Selected("gemm.concurrent") || absl::GetFlag(FLAGS_cpu_time)) return;
  const int64_t m = 2048, n = 512, k = 512;
  const int workers =
      std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  const bool native = NativeBf16Available();
  const DType dtype = native ? DType::kBFloat16 : DType::kFloat32;
  const std::string shape =
      absl::StrFormat("m=%d n=%d k=%d NN x %d threads", m, n, k, workers);
  const Bf16PathPolicy saved_policy =
      internal::SetBf16PathPolicyForTesting(Bf16PathPolicy::kNative);
  const bool saved_force = internal::SetForceMatmulPrimitiveForTesting(!native);
  const int saved_threads = ThreadPool::Global().num_threads();
  ThreadPool::SetGlobalThreads(1);
  const double flops = 2.0 * m * n * k;
  // Best time of one call on each of `threads` threads at once; the slowest
  // thread's.
  auto at_once = [&](int threads) {
    std::vector<double> best(threads, 1e30);
    std::vector<std::thread> pool;
    for (int w = 0; w < threads; ++w) {
      pool.emplace_back([&, w] {
        Tensor a = Tensor::Full({m, k}, 0.01, dtype);
        Tensor b = Tensor::Full({k, n}, 0.02, dtype);
        Tensor c = Tensor::Empty({m, n}, DType::kFloat32);
        best[w] = BestTime([&] { Check(Gemm(a, false, b, false, &c)); });
      });
    }
    for (std::thread& t : pool) t.join();
    return *std::max_element(best.begin(), best.end());
  };
  const double alone = at_once(1);
  const double together = at_once(workers);
  ThreadPool::SetGlobalThreads(saved_threads);
  internal::SetForceMatmulPrimitiveForTesting(saved_force);
  internal::SetBf16PathPolicyForTesting(saved_policy);
  const std::string dt = native ? "bf16" : "fp32";
  g_rows.push_back({"gemm.concurrent.alone", dt, shape, flops / alone / 1e9,
                    "GFLOP/s", "one thread, the others idle"});
  g_rows.push_back({"gemm.concurrent", dt, shape, flops / together / 1e9,
                    "GFLOP/s", "gemm.concurrent.alone", alone / together});
}

// ---- Memory-bound kernels --------------------------------------------------

// Source and destination of the reference copies.
std::vector<char>* g_src = nullptr;
std::vector<char>* g_dst = nullptr;

// memcpy of `bytes` bytes on the pool's threads.
void ParallelCopy(int64_t bytes) {
  char* dst = g_dst->data();
  const char* src = g_src->data();
  ParallelForElements(bytes / 64, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b * 64, src + b * 64, (e - b) * 64);
  });
}

void BenchMemcpy(int64_t bytes) {
  g_src = new std::vector<char>(bytes, 1);
  g_dst = new std::vector<char>(bytes, 0);
  const double t = BestTime([&] { ParallelCopy(bytes); });
  const double t1 =
      BestTime([&] { std::memcpy(g_dst->data(), g_src->data(), bytes); });
  const std::string shape = absl::StrCat(bytes >> 20, " MiB");
  g_rows.push_back({"memcpy.1thread", "byte", shape, 2.0 * bytes / t1 / 1e9,
                    "GB/s", "read+write"});
  g_rows.push_back(
      {"memcpy", "byte", shape, 2.0 * bytes / t / 1e9, "GB/s",
       absl::StrCat("read+write, ", ThreadPool::Global().num_threads(),
                    " threads")});
}

// A kernel moving `bytes` (reads + writes), timed alternately with a
// parallel memcpy moving as many bytes, so both see the same machine load.
void AddMem(const std::string& name, DType dt, const Shape& shape, double bytes,
            const std::function<void()>& fn) {
  if (!Selected(name)) return;
  const int64_t copy = std::min<int64_t>(static_cast<int64_t>(bytes / 2),
                                         static_cast<int64_t>(g_src->size()));
  auto [t, t_copy] = BestTimes(fn, [&] { ParallelCopy(copy); });
  const double gbs = bytes / t / 1e9;
  const double copy_gbs = 2.0 * copy / t_copy / 1e9;
  const std::string ref = absl::StrCat(name, ".memcpy");
  g_rows.push_back({ref, "byte", ShapeToString(shape), copy_gbs, "GB/s",
                    "same bytes, interleaved"});
  g_rows.push_back({name, std::string(DTypeName(dt)), ShapeToString(shape), gbs,
                    "GB/s", ref, gbs / copy_gbs});
}

void BenchMemoryBound() {
  const int64_t h = 4096;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    // 64 MiB per tensor in every dtype (16M fp32 elements, 32M 16-bit ones):
    // each dtype's kernels and their reference copies move the same bytes,
    // twice the 32 MiB L3, so neither side runs from the cache.
    const int64_t rows = 4096 * 4 / DTypeSize(dt);
    const Shape s{rows, h};
    const double n = static_cast<double>(rows * h);
    const double e = static_cast<double>(DTypeSize(dt));
    Tensor x = Tensor::Full(s, 0.5, dt);
    Tensor y = Tensor::Zeros(s, dt);
    Tensor dy = Tensor::Full(s, 0.25, dt);
    Tensor bias = Tensor::Full({h}, 0.1, DType::kFloat32);
    Tensor dbias = Tensor::Zeros({h}, DType::kFloat32);
    AddMem("bias_add", dt, s, 2 * n * e, [&] { Check(BiasAdd(x, bias, &y)); });
    AddMem("bias_add.backward", dt, s, n * e,
           [&] { Check(BiasAddBackward(dy, &dbias)); });
    AddMem("gelu", dt, s, 2 * n * e, [&] { Check(Gelu(x, &y)); });
    AddMem("gelu.backward", dt, s, 3 * n * e,
           [&] { Check(GeluBackward(dy, x, &y)); });
    AddMem("bias_gelu", dt, s, 2 * n * e,
           [&] { Check(BiasGelu(x, bias, &y)); });
    AddMem("bias_gelu.backward", dt, s, 3 * n * e,
           [&] { Check(BiasGeluBackward(dy, x, bias, &y, &dbias)); });
    Tensor half = Tensor::Zeros({rows, h / 2}, dt);
    Tensor dhalf = Tensor::Full({rows, h / 2}, 0.25, dt);
    AddMem("swiglu", dt, s, 1.5 * n * e, [&] { Check(SwiGLU(x, &half)); });
    AddMem("swiglu.backward", dt, s, 2.5 * n * e,
           [&] { Check(SwiGLUBackward(dhalf, x, &y)); });
    uint64_t offset = 0;
    AddMem("dropout", dt, s, 2 * n * e, [&] {
      Check(Dropout(x, 0.1f, 1234, offset, &y));
      offset += x.numel();
    });
    AddMem("sum_of_squares", dt, s, n * e,
           [&] { CHECK(SumOfSquares(x).ok()); });
  }
  // The attention's q/k/v split of the QKV projection's output and its
  // backward merge at `train --preset bench`'s shape (b 4, s 512, 8 heads of
  // 64): rows [s, b] of [heads, 3, d] <-> q, k, v [b, s, heads, d], three
  // CopyStrided calls each way (layout.h's plan).
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const int64_t b = 4, sq = 512, heads = 8, d = 64, row = heads * 3 * d;
    Tensor qkv = Tensor::Full({sq * b, row}, 0.5, dt);
    Tensor q = Tensor::Zeros({b, sq, heads, d}, dt);
    Tensor k = Tensor::Zeros({b, sq, heads, d}, dt);
    Tensor v = Tensor::Zeros({b, sq, heads, d}, dt);
    auto plan = [&](int part) {
      StridedCopyPlan p;
      p.rank = 5;
      const int64_t shape[5] = {b, sq, heads, 1, d};
      const int64_t fused[5] = {row, b * row, 3 * d, d, 1};
      const int64_t split[5] = {sq * heads * d, heads * d, d, d, 1};
      for (int i = 0; i < 5; ++i) {
        p.shape[i] = shape[i];
        p.src_strides[i] = fused[i];
        p.dst_strides[i] = split[i];
      }
      p.src_offset = part * d;
      return p;
    };
    const double bytes = 2.0 * qkv.numel() * DTypeSize(dt);
    const Shape shape{sq * b, row};
    AddMem("qkv_split", dt, shape, bytes, [&] {
      Check(CopyStrided(qkv, plan(0), &q));
      Check(CopyStrided(qkv, plan(1), &k));
      Check(CopyStrided(qkv, plan(2), &v));
    });
    AddMem("qkv_merge", dt, shape, bytes, [&] {
      Check(CopyStrided(q, SwapSides(plan(0)), &qkv));
      Check(CopyStrided(k, SwapSides(plan(1)), &qkv));
      Check(CopyStrided(v, SwapSides(plan(2)), &qkv));
    });
  }
  // Embedding: rows of 2048 from a 32000-row table; 8192 tokens in fp32,
  // 16384 in 16-bit dtypes (64 MiB out either way, as above).
  {
    const int64_t hidden = 2048, vocab = 32000;
    auto token_ids = [&](int64_t tokens) {  // scattered rows
      std::vector<int64_t> idv(tokens);
      for (int64_t i = 0; i < tokens; ++i) idv[i] = (i * 7919) % vocab;
      return Tensor::FromInts(idv, {tokens}, DType::kInt32).value();
    };
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const int64_t tokens = 8192 * 4 / DTypeSize(dt);
      Tensor ids = token_ids(tokens);
      Tensor table = Tensor::Full({vocab, hidden}, 0.5, dt);
      Tensor out = Tensor::Zeros({tokens, hidden}, dt);
      const double bytes = 2.0 * tokens * hidden * DTypeSize(dt);
      AddMem("embedding", dt, {tokens, hidden}, bytes,
             [&] { Check(EmbeddingLookup(ids, table, &out)); });
    }
    const int64_t tokens = 8192;
    Tensor ids = token_ids(tokens);
    Tensor dtable = Tensor::Zeros({vocab, hidden}, DType::kFloat32);
    Tensor dout = Tensor::Full({tokens, hidden}, 0.5, DType::kFloat32);
    // Reads dout and read-modify-writes one table row per token.
    AddMem("embedding.backward", DType::kFloat32, {tokens, hidden},
           3.0 * tokens * hidden * 4,
           [&] { Check(EmbeddingBackward(ids, dout, &dtable)); });
  }
  // AdamW on 16M fp32 parameters: reads p, g, m, v; writes p, m, v (+ bf16).
  {
    const int64_t params = 4096 * h;
    const double n = static_cast<double>(params);
    const Shape ps{params};
    Tensor p = Tensor::Full(ps, 0.5, DType::kFloat32);
    Tensor g = Tensor::Full(ps, 0.01, DType::kFloat32);
    Tensor m = Tensor::Zeros(ps, DType::kFloat32);
    Tensor v = Tensor::Zeros(ps, DType::kFloat32);
    Tensor p16 = Tensor::Zeros(ps, DType::kBFloat16);
    AdamWConfig c;
    c.weight_decay = 0.1f;
    AddMem("adamw", DType::kFloat32, ps, 7.0 * n * 4, [&] {
      Check(AdamWStep(c, g, &p, &m, &v));
      ++c.step;
    });
    AddMem("adamw+bf16_copy", DType::kFloat32, ps, 7.0 * n * 4 + 2 * n, [&] {
      Check(AdamWStep(c, g, &p, &m, &v, &p16));
      ++c.step;
    });
    Tensor p_h = Tensor::Zeros(ps, DType::kFloat16);
    AddMem("adamw+fp16_copy", DType::kFloat32, ps, 7.0 * n * 4 + 2 * n, [&] {
      Check(AdamWStep(c, g, &p, &m, &v, &p_h));
      ++c.step;
    });
  }
}

void Print(bool json) {
  if (json) {
    for (const Row& r : g_rows) {
      std::printf(
          "{\"name\": \"%s\", \"dtype\": \"%s\", \"shape\": \"%s\", "
          "\"value\": %.3f, \"unit\": \"%s\"}\n",
          r.name.c_str(), r.dtype.c_str(), r.shape.c_str(), r.value,
          r.unit.c_str());
    }
    return;
  }
  std::printf("%-30s %-5s %-28s %10s %-8s %s\n", "name", "dtype", "shape",
              "value", "unit", "vs reference");
  for (const Row& r : g_rows) {
    std::string vs = r.versus;
    if (r.ratio > 0)
      vs = absl::StrFormat("%5.1f%% of %s", 100 * r.ratio, r.versus);
    std::printf("%-30s %-5s %-28s %10.2f %-8s %s\n", r.name.c_str(),
                r.dtype.c_str(), r.shape.c_str(), r.value, r.unit.c_str(),
                vs.c_str());
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "table" && format != "json") {
    std::fprintf(stderr, "--format must be table or json, got %s\n",
                 format.c_str());
    return 2;
  }
  using mcc::ops::GemmCase;
  const int64_t t = 2048, h = 512;  // tokens, hidden (ffn 4h, qkv 3h)
  const int64_t vocab = 8192;       // train --preset bench's
  const GemmCase cases[] = {
      {"qkv.fwd", false, true, t, 3 * h, h, 0},
      {"qkv.dgrad", false, false, t, h, 3 * h, 0},
      {"qkv.wgrad", true, false, 3 * h, h, t, 1},
      {"proj.fwd", false, true, t, h, h, 0},
      {"proj.dgrad", false, false, t, h, h, 0},
      {"proj.wgrad", true, false, h, h, t, 1},
      {"fc1.fwd", false, true, t, 4 * h, h, 0},
      {"fc1.dgrad", false, false, t, h, 4 * h, 0},
      {"fc1.wgrad", true, false, 4 * h, h, t, 1},
      {"fc2.fwd", false, true, t, h, 4 * h, 0},
      {"fc2.dgrad", false, false, t, 4 * h, h, 0},
      {"fc2.wgrad", true, false, h, 4 * h, t, 1},
      {"logits.fwd", false, true, t, vocab, h, 0},
      {"logits.dgrad", false, false, t, h, vocab, 0},
      {"logits.wgrad", true, false, vocab, h, t, 1},
      {"square", false, false, 2048, 2048, 2048, 0},
      // The shape train's "GEMM peak for MFU" probe times on the CPU.
      {"mfu_peak", false, false, 1024, 1024, 1024, 0},
  };
  LOG(INFO) << "threads: " << mcc::ThreadPool::Global().num_threads()
            << ", native bf16 GEMM: " << mcc::ops::NativeBf16Isa();
  for (const GemmCase& g : cases) mcc::ops::BenchGemm(g);
  mcc::ops::BenchConcurrentGemm();
  mcc::ops::BenchMemcpy(int64_t{224} << 20);
  mcc::ops::BenchMemoryBound();
  mcc::ops::Print(format == "json");
  return 0;
}
