// The MoE layer's compute against dense compute of the same FLOPs (issue
// 41's target: the grouped GEMM at 85% or more of the dense GEMM's rate), in
// one run:
//
//   tools/bazel run -c opt //models/moe:moe_layer_bench [-- --threads N]
//
// gemm: the experts' grouped GEMM (E experts, R routed rows split evenly or
//   skewed, expert e's share proportional to e + 1) against one dense GEMM
//   of the same FLOPs: the forward x [R, h] W_e^T (W_e [f, h]) against
//   x W^T, and the weight gradient dW_e += dy_e^T x_e (fp32, accumulated)
//   against dW += dy^T x.
// layer: the whole MoeMlp (router with its balancing loss, permute, grouped
//   SwiGLU experts, unpermute; forward and backward) against a dense SwiGLU
//   MLP of the same active FLOPs (ffn = topk x the expert's ffn), built from
//   the same ops as the experts; T tokens, no shared expert, new tokens
//   every call (so the experts' row counts change as they do step by
//   step). The router's own GEMMs are extra FLOPs the MoE layer pays
//   (printed).
//
// Each pair is timed alternately (--reps times, medians) by wall time and by
// the process's CPU time. With --threads 1 (the default) the CPU time is the
// load-independent figure: the rate per core on a shared machine. Wall time
// and --threads > 1 need a quiet machine (CPU time would count OpenMP's
// spinning). Before timing, every pair is checked to compute the same thing
// (grouped = a dense GEMM per expert; the MoE layer with one expert = the
// dense MLP with its weights), and the run fails if not.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/op_profile.h"
#include "core/ops/activation.h"
#include "core/ops/expert_weight_packing.h"
#include "core/ops/gemm.h"
#include "core/ops/grouped_gemm.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "models/moe/bench_timer.h"
#include "models/moe/moe_mlp.h"

ABSL_FLAG(int32_t, threads, 1, "Threads (0: the global pool's default).");
ABSL_FLAG(int32_t, reps, 7, "Timed calls of each side (medians taken).");
ABSL_FLAG(std::string, sections, "gemm,layer", "gemm and/or layer.");
ABSL_FLAG(std::string, dtypes, "fp32,bf16", "fp32 and/or bf16.");
ABSL_FLAG(std::string, gemms, "8x4096x512x1408,8x4096x1024x512,64x4096x512x256",
          "Grouped GEMM shapes: experts x rows x h x f, comma-separated.");
ABSL_FLAG(std::string, layers, "8x2x1408,64x8x256",
          "MoE layers: experts x topk x expert ffn, comma-separated.");
ABSL_FLAG(int64_t, tokens, 2048, "Tokens per layer call.");
ABSL_FLAG(int64_t, hidden, 512, "The layers' hidden size.");
ABSL_FLAG(bool, same_tokens, false,
          "Route the same tokens every call (fixed expert row counts).");
ABSL_FLAG(bool, pack_expert_weights, true,
          "Time the grouped forward and data gradient (gemm) and the MoE "
          "layer (layer) inside a ScopedExpertWeightPacking "
          "(core/ops/expert_weight_packing.h: each expert's weight packed "
          "once, as in a training step's later micro-batches); gemm also "
          "prints a step's first call (the packing).");
ABSL_FLAG(bool, profile, true, "Print each layer's per-op wall time shares.");

namespace mcc {
namespace moe {
namespace {

Tensor Random(Shape shape, float scale, uint32_t seed, DType dtype) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(NumElements(shape));
  for (float& x : v) x = dist(gen);
  return *Tensor::FromVector(v, shape, dtype);
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

std::vector<std::vector<int64_t>> ParseShapes(const std::string& list,
                                              size_t dims) {
  std::vector<std::vector<int64_t>> out;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    std::vector<int64_t> shape;
    for (absl::string_view d : absl::StrSplit(item, 'x')) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(d, &v) || v < 1) shape.clear();
      shape.push_back(v);
    }
    if (shape.size() != dims) {
      std::fprintf(stderr, "bad shape '%s': want %zu positive sizes\n",
                   std::string(item).c_str(), dims);
      std::exit(2);
    }
    out.push_back(shape);
  }
  return out;
}

// Largest |a - b| over the largest |b|.
double RelDiff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.ToDoubles(), y = b.ToDoubles();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

// fp32 sums of h or fewer terms differ by at most a few ulps of the sum's
// scale; a bf16 output by one rounding more. Anything larger is a bug.
double Tolerance(DType dt) { return dt == DType::kFloat32 ? 1e-5 : 1e-2; }

void Require(bool ok, const std::string& what, double diff) {
  if (ok) return;
  std::fprintf(stderr, "CHECK FAILED: %s differ by %.3g of the largest entry\n",
               what.c_str(), diff);
  std::exit(1);
}

void CheckOk(const absl::Status& s) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  std::exit(1);
}

// Alternates a and b `reps` times after one untimed call of each (the bf16
// path's first-use timing, primitive creation, scratch growth).
template <typename A, typename B>
std::pair<BenchTime, BenchTime> TimePair(int reps, A&& a, B&& b) {
  a();
  b();
  std::vector<BenchTime> ta, tb;
  for (int r = 0; r < reps; ++r) {
    ta.push_back(TimeCall(a));
    tb.push_back(TimeCall(b));
  }
  return {Median(ta), Median(tb)};
}

void PrintRow(const char* what, double flops, const BenchTime& dense,
              const BenchTime& moe) {
  std::printf("%-44s | %7.1f %7.1f %5.0f%% | %7.1f %7.1f %5.0f%%\n", what,
              flops / dense.cpu * 1e-9, flops / moe.cpu * 1e-9,
              100.0 * dense.cpu / moe.cpu, flops / dense.wall * 1e-9,
              flops / moe.wall * 1e-9, 100.0 * dense.wall / moe.wall);
}

void PrintHeader(const char* what, const char* dense, const char* moe) {
  std::printf("\n%-44s | %-23s | %-23s\n", what, "GFLOP/s per CPU second",
              "GFLOP/s wall");
  std::printf("%-44s | %7s %7s %6s | %7s %7s %6s\n", "", dense, moe, "ratio",
              dense, moe, "ratio");
}

void GemmSection(DType dt, int reps) {
  PrintHeader(absl::StrCat("grouped GEMM, ", DTypeName(dt)).c_str(), "dense",
              "grouped");
  for (const std::vector<int64_t>& s :
       ParseShapes(absl::GetFlag(FLAGS_gemms), 4)) {
    const int64_t experts = s[0], rows = s[1], h = s[2], f = s[3];
    const Tensor x = Random({rows, h}, 1.0f, 1, dt);
    const Tensor w = Random({experts, f, h}, 0.05f, 2, dt);
    const Tensor dy = Random({rows, f}, 1.0f, 3, dt);
    const Tensor wd = w.Slice(0, 1)->Reshape({f, h}).value();
    const double flops = 2.0 * rows * f * h;
    for (bool skewed : {false, true}) {
      const std::vector<int64_t> sizes = Split(rows, experts, skewed);
      Tensor y = Tensor::Empty({rows, f}, dt);
      Tensor yd = Tensor::Empty({rows, f}, dt);
      Tensor dw = Tensor::Zeros({experts, f, h}, DType::kFloat32);
      Tensor dwd = Tensor::Zeros({f, h}, DType::kFloat32);
      // Check: each expert's rows against a dense GEMM of them alone.
      CheckOk(ops::GroupedGemm(x, w, true, sizes, &y));
      CheckOk(ops::GroupedGemmWeightGrad(x, dy, true, sizes, &dw, 0.0f));
      int64_t row = 0;
      for (int64_t e = 0; e < experts; ++e) {
        const Tensor we = w.Slice(e, e + 1)->Reshape({f, h}).value();
        const Tensor xe = x.Slice(row, row + sizes[e]).value();
        const Tensor dye = dy.Slice(row, row + sizes[e]).value();
        Tensor ye = Tensor::Empty({sizes[e], f}, dt);
        Tensor dwe = Tensor::Zeros({f, h}, DType::kFloat32);
        CheckOk(ops::Gemm(xe, false, we, true, &ye));
        CheckOk(ops::Gemm(dye, true, xe, false, &dwe));
        const double dy_diff =
            RelDiff(y.Slice(row, row + sizes[e]).value(), ye);
        Require(dy_diff <= Tolerance(dt), "grouped and per-expert GEMMs",
                dy_diff);
        const double dw_diff =
            RelDiff(dw.Slice(e, e + 1)->Reshape({f, h}).value(), dwe);
        Require(dw_diff <= 1e-5, "grouped and per-expert weight gradients",
                dw_diff);
        row += sizes[e];
      }
      const Tensor y_checked = y.Clone();
      // The packs live for the timed calls (one step's micro-batches); the
      // untimed first call of TimePair makes them.
      std::optional<ops::ScopedExpertWeightPacking> packing;
      if (absl::GetFlag(FLAGS_pack_expert_weights)) {
        // A first step's scope creates the primitives of these row counts
        // (once per process), so the timed scope's first calls cost the
        // packing alone, as every later step's.
        ops::ScopedExpertWeightPacking first_step;
        CheckOk(ops::GroupedGemm(x, w, true, sizes, &y));
        Tensor dx = Tensor::Empty({rows, h}, dt);
        CheckOk(ops::GroupedGemm(dy, w, false, sizes, &dx));
      }
      if (absl::GetFlag(FLAGS_pack_expert_weights)) packing.emplace();
      const BenchTime first_fwd =
          TimeCall([&] { CheckOk(ops::GroupedGemm(x, w, true, sizes, &y)); });
      const double packed_diff = RelDiff(y, y_checked);
      Require(packed_diff <= Tolerance(dt), "packed and checked grouped GEMMs",
              packed_diff);
      const auto fwd = TimePair(
          reps, [&] { CheckOk(ops::Gemm(x, false, wd, true, &yd)); },
          [&] { CheckOk(ops::GroupedGemm(x, w, true, sizes, &y)); });
      Tensor dx = Tensor::Empty({rows, h}, dt);
      Tensor dxd = Tensor::Empty({rows, h}, dt);
      const BenchTime first_dgrad = TimeCall(
          [&] { CheckOk(ops::GroupedGemm(dy, w, false, sizes, &dx)); });
      const auto dgrad = TimePair(
          reps, [&] { CheckOk(ops::Gemm(dy, false, wd, false, &dxd)); },
          [&] { CheckOk(ops::GroupedGemm(dy, w, false, sizes, &dx)); });
      const int64_t packed_bytes = packing ? packing->packed_bytes() : 0;
      packing.reset();
      const auto wgrad = TimePair(
          reps,
          [&] { CheckOk(ops::Gemm(dy, true, x, false, &dwd, 1.0f, 1.0f)); },
          [&] {
            CheckOk(ops::GroupedGemmWeightGrad(x, dy, true, sizes, &dw, 1.0f));
          });
      const std::string shape =
          absl::StrCat("E", experts, " R", rows, " h", h, " f", f, " ",
                       skewed ? "skewed" : "even");
      PrintRow((shape + " forward").c_str(), flops, fwd.first, fwd.second);
      PrintRow((shape + " data grad").c_str(), flops, dgrad.first,
               dgrad.second);
      PrintRow((shape + " weight grad").c_str(), flops, wgrad.first,
               wgrad.second);
      if (packed_bytes > 0) {
        std::printf(
            "%-44s | packed %.1f MiB; a step's first call (packs) fwd %.2f ms, "
            "dgrad %.2f ms CPU; later calls %.2f / %.2f ms\n",
            "", packed_bytes / 1048576.0, first_fwd.cpu * 1e3,
            first_dgrad.cpu * 1e3, fwd.second.cpu * 1e3,
            dgrad.second.cpu * 1e3);
      }
    }
  }
}

// A SwiGLU MLP without biases, from the ops the MoE experts use: fc1 [2F, h],
// fc2 [h, F], fp32 main gradients accumulated.
struct DenseMlp {
  Tensor w1, w2, g1, g2;
  Tensor fc1_out, act_out;  // Kept by Forward for Backward.

  Tensor Forward(const Tensor& x) {
    const int64_t t = x.size(0), h = x.size(1), f = w2.size(1);
    fc1_out = Tensor::Empty({t, 2 * f}, x.dtype());
    CheckOk(ops::Gemm(x, false, w1, true, &fc1_out));
    act_out = Tensor::Empty({t, f}, x.dtype());
    CheckOk(ops::SwiGLU(fc1_out, &act_out));
    Tensor y = Tensor::Empty({t, h}, x.dtype());
    CheckOk(ops::Gemm(act_out, false, w2, true, &y));
    return y;
  }
  Tensor Backward(const Tensor& x, const Tensor& dy) {
    const int64_t t = x.size(0), h = x.size(1), f = w2.size(1);
    CheckOk(ops::Gemm(dy, true, act_out, false, &g2, 1.0f, 1.0f));
    Tensor dact = Tensor::Empty({t, f}, x.dtype());
    CheckOk(ops::Gemm(dy, false, w2, false, &dact));
    Tensor dfc1 = Tensor::Empty({t, 2 * f}, x.dtype());
    CheckOk(ops::SwiGLUBackward(dact, fc1_out, &dfc1));
    CheckOk(ops::Gemm(dfc1, true, x, false, &g1, 1.0f, 1.0f));
    Tensor dx = Tensor::Empty({t, h}, x.dtype());
    CheckOk(ops::Gemm(dfc1, false, w1, false, &dx));
    return dx;
  }
};

MoeMlpConfig LayerConfig(DType dt, int64_t h, int64_t experts, int64_t topk,
                         int64_t ffn) {
  MoeMlpConfig c;
  c.hidden_size = h;
  c.num_experts = experts;
  c.ffn_hidden_size = ffn;
  c.router.topk = topk;
  c.load_balancing = LoadBalancing::kAuxLoss;
  c.aux_loss_coeff = 1e-2f;
  c.dtype = dt;
  return c;
}

// The dense reference computes what one expert computes: with a single
// expert (top-1, combine weight 1) the MoE layer is the dense MLP.
void CheckDenseMatchesOneExpert(DType dt, const Tensor& x, const Tensor& dy) {
  const int64_t h = x.size(1), f = 96;
  auto moe = MoeMlp::Create("check", LayerConfig(dt, h, 1, 1, f));
  CheckOk(moe.status());
  DenseMlp dense;
  dense.w1 = (*moe)->fc1_weight().value.Reshape({2 * f, h}).value();
  dense.w2 = (*moe)->fc2_weight().value.Reshape({h, f}).value();
  dense.g1 = Tensor::Zeros({2 * f, h}, DType::kFloat32);
  dense.g2 = Tensor::Zeros({h, f}, DType::kFloat32);
  MoeMlp::Activations act;
  auto y = (*moe)->Forward(x, 1, &act);
  CheckOk(y.status());
  auto dx = (*moe)->Backward(dy, act);
  CheckOk(dx.status());
  const Tensor yd = dense.Forward(x);
  const Tensor dxd = dense.Backward(x, dy);
  const double tol = Tolerance(dt);
  // dx also holds the router's gradient, zero for one expert (its softmax
  // is constant) up to rounding.
  double d = RelDiff(*y, yd);
  Require(d <= tol, "one-expert MoE layer and dense MLP outputs", d);
  d = RelDiff(*dx, dxd);
  Require(d <= tol, "one-expert MoE layer and dense MLP input gradients", d);
  d = RelDiff((*moe)->fc1_weight().main_grad.Reshape({2 * f, h}).value(),
              dense.g1);
  Require(d <= tol, "one-expert MoE layer and dense MLP fc1 gradients", d);
  d = RelDiff((*moe)->fc2_weight().main_grad.Reshape({h, f}).value(), dense.g2);
  Require(d <= tol, "one-expert MoE layer and dense MLP fc2 gradients", d);
}

void LayerSection(DType dt, int reps) {
  const int64_t t = absl::GetFlag(FLAGS_tokens),
                h = absl::GetFlag(FLAGS_hidden);
  const Tensor dy = Random({t, h}, 1.0f, 5, dt);
  // New tokens every call, as every training step has: the experts' row
  // counts change call by call (unless --same_tokens).
  std::vector<Tensor> xs;
  for (int i = 0; i < (absl::GetFlag(FLAGS_same_tokens) ? 1 : reps + 2); ++i) {
    xs.push_back(Random({t, h}, 1.0f, 4 + 100 * i, dt));
  }
  CheckDenseMatchesOneExpert(dt, xs[0], dy);
  PrintHeader(absl::StrCat("MoE layer forward + backward, ", DTypeName(dt),
                           ", ", t, " tokens, h", h)
                  .c_str(),
              "dense", "MoE");
  for (const std::vector<int64_t>& s :
       ParseShapes(absl::GetFlag(FLAGS_layers), 3)) {
    const int64_t experts = s[0], topk = s[1], f = s[2];
    auto moe = MoeMlp::Create("moe", LayerConfig(dt, h, experts, topk, f));
    CheckOk(moe.status());
    DenseMlp dense;
    const int64_t fd = topk * f;
    dense.w1 = Random({2 * fd, h}, 0.02f, 6, dt);
    dense.w2 = Random({h, fd}, 0.02f, 7, dt);
    dense.g1 = Tensor::Zeros({2 * fd, h}, DType::kFloat32);
    dense.g2 = Tensor::Zeros({h, fd}, DType::kFloat32);
    MoeMlp::Activations act;
    size_t moe_calls = 0, dense_calls = 0;
    auto run_moe = [&] {
      act = MoeMlp::Activations();
      auto y = (*moe)->Forward(xs[moe_calls++ % xs.size()], 1, &act);
      CheckOk(y.status());
      CheckOk((*moe)->Backward(dy, act).status());
    };
    auto run_dense = [&] {
      const Tensor& x = xs[dense_calls++ % xs.size()];
      dense.Forward(x);
      dense.Backward(x, dy);
    };
    // The timed calls share one step's packs (Backward only accumulates
    // gradients: the weights do not change); TimePair's untimed call makes
    // them.
    std::optional<ops::ScopedExpertWeightPacking> packing;
    if (absl::GetFlag(FLAGS_pack_expert_weights)) packing.emplace();
    const int64_t primitives = ops::internal::MatmulPrimitivesCreated();
    const auto times = TimePair(reps, run_dense, run_moe);
    const int64_t created =
        ops::internal::MatmulPrimitivesCreated() - primitives;
    // Experts: 3 GEMMs of 2 t k f h (fc1 twice as wide) forward, twice that
    // backward; the router 2 t E h forward, twice that backward.
    const double flops = 18.0 * t * topk * f * h;
    const double router = 6.0 * t * experts * h;
    int64_t busiest = 0;
    for (int64_t n : act.tokens_per_expert) busiest = std::max(busiest, n);
    PrintRow(
        absl::StrCat("E", experts, " top-", topk, " f", f, " (dense f", fd, ")")
            .c_str(),
        flops, times.first, times.second);
    std::printf(
        "  router GEMMs +%.1f%% FLOPs; busiest expert %lld rows (mean %lld); "
        "ms per call: dense %.1f cpu / %.1f wall, MoE %.1f cpu / %.1f wall; "
        "oneDNN matmul primitives created while timing: %lld; expert weights "
        "packed: %.1f MiB\n",
        100.0 * router / flops, static_cast<long long>(busiest),
        static_cast<long long>(t * topk / experts), 1e3 * times.first.cpu,
        1e3 * times.first.wall, 1e3 * times.second.cpu, 1e3 * times.second.wall,
        static_cast<long long>(created),
        packing ? packing->packed_bytes() / 1048576.0 : 0.0);
    if (absl::GetFlag(FLAGS_profile)) {
      for (int side = 0; side < 2; ++side) {
        OpProfile::Reset();
        OpProfile::Enable(true);
        const BenchTime one =
            side == 0 ? TimeCall(run_dense) : TimeCall(run_moe);
        OpProfile::Enable(false);
        std::printf(
            "  %s ops (wall): %s\n", side == 0 ? "dense" : "MoE",
            OpProfile::Format(OpProfile::Snapshot(), one.wall, 8).c_str());
      }
    }
  }
}

void Run() {
  if (absl::GetFlag(FLAGS_threads) > 0) {
    ThreadPool::SetGlobalThreads(absl::GetFlag(FLAGS_threads));
  }
  const int reps = absl::GetFlag(FLAGS_reps);
  std::printf("threads %d; bf16 GEMMs: native kernels %s\n",
              ThreadPool::Global().num_threads(), ops::NativeBf16Isa());
  const std::vector<std::string> sections =
      absl::StrSplit(absl::GetFlag(FLAGS_sections), ',', absl::SkipEmpty());
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',', absl::SkipEmpty())) {
    const DType dt = name == "bf16" ? DType::kBFloat16 : DType::kFloat32;
    for (const std::string& section : sections) {
      if (section == "gemm") GemmSection(dt, reps);
      if (section == "layer") LayerSection(dt, reps);
    }
  }
  const std::vector<ops::Bf16GemmChoice> choices = ops::Bf16GemmChoices();
  if (!choices.empty()) std::printf("\nbf16 GEMM paths chosen:\n");
  for (const ops::Bf16GemmChoice& c : choices) {
    std::printf("  %s\n", ops::FormatBf16GemmChoice(c).c_str());
  }
}

}  // namespace
}  // namespace moe
}  // namespace mcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  mcc::moe::Run();
  return 0;
}
