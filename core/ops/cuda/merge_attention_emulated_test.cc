// The softmax-merge CUDA kernel (merge_attention_kernels.cuh), run on the
// host through cuda_emulator.h, against the merge formula of
// parallel/context_parallel/softmax_merge.h evaluated in float64. Needs no
// GPU.
//
// Bound: u = 2^-24. The kernel's weights wa = exp(a - l), wc = exp(c - l)
// come from expf and logf (2 ulp each on CUDA, within 1 on the host) of
// arguments rounded once, so each is within (12u + 2u (|a| + |c| + |l|))
// relatively; the two products and the sum add 3u. So out is within
// (15u + 2u (|a| + |c| + |l|)) (|wa o| + |wc p|), and l within
// 8u (|m| + 1).
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

// After every other header: it defines CUDA's keywords as macros.
#include "core/ops/cuda/cuda_emulator.h"
// The kernel, after the definitions it expects.
#include "core/ops/cuda/merge_attention_kernels.cuh"

namespace mcc {
namespace {

namespace merge = ::mcc::cuda_kernels::merge;
using cuda_emu::Dim3;
using cuda_emu::Emulator;

TEST(MergeAttentionEmulatedTest, MatchesTheFormula) {
  constexpr double u = 1.0 / (1 << 24);
  const int64_t b = 2, s = 37, h = 3, d = 80;
  std::mt19937 gen(17);
  std::uniform_real_distribution<float> val(-2.0f, 2.0f), lse(-30.0f, 30.0f);
  std::vector<float> out(b * s * h * d), part(out.size());
  std::vector<float> l(b * h * s), pl(l.size());
  for (float& x : out) x = val(gen);
  for (float& x : part) x = val(gen);
  for (size_t i = 0; i < l.size(); ++i) {
    // Some rows have seen no key on one side, or on both.
    l[i] = i % 7 == 0 ? -INFINITY : lse(gen);
    pl[i] = i % 5 == 0 ? -INFINITY : lse(gen);
  }
  const std::vector<float> out0 = out, l0 = l;
  merge::Params p;
  p.part_out = part.data();
  p.part_lse = pl.data();
  p.out = out.data();
  p.lse = l.data();
  p.b = b;
  p.s = s;
  p.h = h;
  p.d = d;
  Emulator::Launch(Dim3{merge::GridFor(p), 1, 1}, merge::kThreads, 0,
                   [&] { merge::MergeKernel(p); });
  int64_t bad = 0;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t t = 0; t < s; ++t) {
      for (int64_t hi = 0; hi < h; ++hi) {
        const int64_t li = (bi * h + hi) * s + t;
        const int64_t row = (bi * s + t) * h + hi;
        const double a = l0[li], c = pl[li];
        if (a == -INFINITY && c == -INFINITY) {
          bad += l[li] != l0[li];
          for (int64_t x = 0; x < d; ++x)
            bad += out[row * d + x] != out0[row * d + x];
          continue;
        }
        const double m = std::max(a, c);
        const double merged = m + std::log(std::exp(a - m) + std::exp(c - m));
        const double wa = std::exp(a - merged), wc = std::exp(c - merged);
        if (std::fabs(l[li] - merged) > 8 * u * (std::fabs(m) + 1)) {
          ++bad;
          ADD_FAILURE() << "lse " << li << ": " << l[li] << " vs " << merged;
        }
        const double rel = 15 * u + 2 * u *
                                        ((a == -INFINITY ? 0 : std::fabs(a)) +
                                         (c == -INFINITY ? 0 : std::fabs(c)) +
                                         std::fabs(merged));
        for (int64_t x = 0; x < d; ++x) {
          const double o = out0[row * d + x], q = part[row * d + x];
          const double want = wa * o + wc * q;
          const double bound = rel * (std::fabs(wa * o) + std::fabs(wc * q));
          if (std::fabs(out[row * d + x] - want) > bound + 1e-30) {
            ++bad;
            ADD_FAILURE() << "out row " << row << " x " << x << ": "
                          << out[row * d + x] << " vs " << want;
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace mcc
