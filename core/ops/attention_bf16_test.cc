// bf16 flash attention on both CPU paths (CpuBf16AttentionPath): the
// AVX512-BF16 dot-product kernels where the CPU has them, and the kernels
// that widen to fp32. Each output is checked against a float64 reference of
// the same bf16 inputs within an error bound derived below, element by
// element; the bound names every rounding the kernels make.
//
// Units: u = 2^-24 (fp32), ub = 2^-8 (bf16 rounding), gamma(n) = nu/(1-nu).
// A product of two bf16 values is exact in fp32, so a dot product of n terms
// is off by at most gamma(n) sum|terms| whatever the order (both paths).
// Forward, for query row i, key j (sigma = scale q.k, m = max, P softmax):
//   score error     E_ij = scale gamma(d + 2) sum_x |q_ix k_jx|
//                          (the product, the scale and the scale's rounding)
//   weight error    delta_ij = E_ij + u |sigma_ij - m_i| + e_exp
//                   (e_exp = 4u: the kernels' exp, about 2 ulp; the running
//                   max and its rescalings cancel between O and the sum)
//   |dO_ix| <= (2 max_j delta_ij + r + 3 gamma(s + 2 blocks))
//              sum_j P_ij |v_jx| + ub |O_ix|
// with r = ub on the dot-product path (P is rounded to bf16 for P V) and 0
// when widened, and ub |O| for the bf16 output.
// Backward (dS = P (dP - D), D = rowsum(dout out) from the kernel's out and
// lse): with delta'_ij = E_ij + |lse error| + u |sigma - lse| + e_exp + u,
// F_ij = gamma(d) sum_x |dout_ix v_jx|, dD_i = sum_x |dout_ix| |out error| +
// gamma(d) sum_x |dout_ix out_ix|:
//   dS error  H_ij = P_ij ((delta'_ij + 2u) |dP_ij - D_i| + F_ij + dD_i)
//                    + r |dS_ij|
//   dQ_ix: scale (sum_j H_ij |k_jx| + gamma(s + 1) sum_j |dS_ij k_jx|)
//          + (u + ub) |dQ_ix|, and dK alike over the group's query rows;
//   dV_jx: sum_i P_ij |dout_ix| (delta'_ij + r + gamma(n + 1)) + ub |dV_jx|.
// These are first-order bounds; the test allows twice them for the
// neglected higher-order terms (relative size ub^2 against ub).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/cpu_isa.h"
#include "core/ops/nn_test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24
constexpr double kUb = 1.0 / 256.0;      // 2^-8
constexpr double kExp = 4 * kU;
constexpr double kSlack = 2.0;

double Gamma(double n) { return n * kU / (1 - n * kU); }

struct Problem {
  int64_t b, s, hq, hkv, d;
  bool causal = true;
  std::vector<int32_t> first;  // empty: no first_key
};

int64_t Idx(const Problem& p, int64_t heads, int64_t bi, int64_t t, int64_t h,
            int64_t x) {
  return ((bi * p.s + t) * heads + h) * p.d + x;
}

bool Sees(const Problem& p, int64_t bi, int64_t i, int64_t j) {
  if (p.causal && j > i) return false;
  return p.first.empty() || j >= p.first[bi * p.s + i];
}

struct Outputs {
  std::vector<double> out, lse, dq, dk, dv;
};

// The kernels on bf16 inputs (outputs bf16, lse fp32).
Outputs RunKernels(const Problem& p, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& dout) {
  const Shape qs{p.b, p.s, p.hq, p.d}, ks{p.b, p.s, p.hkv, p.d};
  AttentionOptions options;
  options.causal = p.causal;
  if (!p.first.empty()) {
    std::vector<int64_t> first64(p.first.begin(), p.first.end());
    options.first_key =
        Tensor::FromInts(first64, {p.b, p.s}, DType::kInt32).value();
  }
  Tensor out = Tensor::Empty(qs, DType::kBFloat16);
  Tensor lse = Tensor::Empty({p.b, p.hq, p.s}, DType::kFloat32);
  EXPECT_TRUE(FlashAttentionForward(q, k, v, options, &out, &lse).ok());
  Tensor dq = Tensor::Empty(qs, DType::kBFloat16);
  Tensor dk = Tensor::Empty(ks, DType::kBFloat16);
  Tensor dv = Tensor::Empty(ks, DType::kBFloat16);
  EXPECT_TRUE(
      FlashAttentionBackward(q, k, v, out, dout, lse, options, &dq, &dk, &dv)
          .ok());
  return {out.ToDoubles(), lse.ToDoubles(), dq.ToDoubles(), dk.ToDoubles(),
          dv.ToDoubles()};
}

// Largest |got - want| / bound, failing each element over its bound.
double Worst(const std::vector<double>& got, const std::vector<double>& want,
             const std::vector<double>& bound, const std::string& what) {
  double worst = 0.0;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (err > bound[i]) {
      if (++reported <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want "
                      << want[i] << ", error " << err << " over bound "
                      << bound[i];
      }
    }
    if (bound[i] > 0) worst = std::max(worst, err / bound[i]);
  }
  return worst;
}

// Checks `got` (one path's outputs) against the float64 reference with the
// bounds above; r is the rounding of P and dS (ub on the dot-product path).
void CheckBounds(const Problem& p, const std::vector<double>& q,
                 const std::vector<double>& k, const std::vector<double>& v,
                 const std::vector<double>& dout, const Outputs& got, double r,
                 const std::string& path) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.d));
  const int64_t group = p.hq / p.hkv;
  const double blocks = (p.s + 63) / 64;
  const double inf = std::numeric_limits<double>::infinity();
  Outputs want{std::vector<double>(q.size(), 0.0),
               std::vector<double>(p.b * p.hq * p.s, -inf),
               std::vector<double>(q.size(), 0.0),
               std::vector<double>(k.size(), 0.0),
               std::vector<double>(v.size(), 0.0)};
  Outputs bound{std::vector<double>(q.size(), 0.0),
                std::vector<double>(p.b * p.hq * p.s, 0.0),
                std::vector<double>(q.size(), 0.0),
                std::vector<double>(k.size(), 0.0),
                std::vector<double>(v.size(), 0.0)};
  std::vector<double> sigma(p.s), e(p.s), w(p.s), dp(p.s), wv(p.d);
  for (int64_t bi = 0; bi < p.b; ++bi) {
    for (int64_t h = 0; h < p.hq; ++h) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < p.s; ++i) {
        double m = -inf;
        for (int64_t j = 0; j < p.s; ++j) {
          if (!Sees(p, bi, i, j)) continue;
          double dot = 0.0, mag = 0.0;
          for (int64_t x = 0; x < p.d; ++x) {
            const double t =
                q[Idx(p, p.hq, bi, i, h, x)] * k[Idx(p, p.hkv, bi, j, kvh, x)];
            dot += t;
            mag += std::fabs(t);
          }
          sigma[j] = dot * scale;
          e[j] = scale * Gamma(p.d + 2) * mag;
          m = std::max(m, sigma[j]);
        }
        const int64_t row = (bi * p.hq + h) * p.s + i;
        if (m == -inf) continue;  // sees nothing: out 0, no gradient
        double l = 0.0, delta_max = 0.0;
        for (int64_t j = 0; j < p.s; ++j) {
          if (!Sees(p, bi, i, j)) continue;
          l += std::exp(sigma[j] - m);
          delta_max =
              std::max(delta_max, e[j] + kU * std::fabs(sigma[j] - m) + kExp);
        }
        const double lse = m + std::log(l);
        want.lse[row] = lse;
        bound.lse[row] =
            kSlack * (delta_max + Gamma(p.s) + kU * (std::fabs(lse) + 1.0));
        std::fill(wv.begin(), wv.end(), 0.0);
        for (int64_t j = 0; j < p.s; ++j) {
          if (!Sees(p, bi, i, j)) continue;
          w[j] = std::exp(sigma[j] - m) / l;
          for (int64_t x = 0; x < p.d; ++x) {
            const double vj = v[Idx(p, p.hkv, bi, j, kvh, x)];
            want.out[Idx(p, p.hq, bi, i, h, x)] += w[j] * vj;
            wv[x] += w[j] * std::fabs(vj);
          }
        }
        // The backward reads the kernel's out and lse: their errors enter
        // D and P.
        const double lse_err =
            std::isinf(got.lse[row]) ? inf : std::fabs(got.lse[row] - lse);
        double dd = 0.0, d_exact = 0.0, d_mag = 0.0;
        for (int64_t x = 0; x < p.d; ++x) {
          const int64_t o = Idx(p, p.hq, bi, i, h, x);
          bound.out[o] =
              kSlack *
              ((2 * delta_max + r + 3 * Gamma(p.s + 2 * blocks)) * wv[x] +
               kUb * std::fabs(want.out[o]));
          d_exact += dout[o] * want.out[o];
          dd += std::fabs(dout[o]) * std::fabs(got.out[o] - want.out[o]);
          d_mag += std::fabs(dout[o] * got.out[o]);
        }
        dd += Gamma(p.d) * d_mag;
        for (int64_t j = 0; j < p.s; ++j) {
          if (!Sees(p, bi, i, j)) continue;
          double g = 0.0, f = 0.0;
          for (int64_t x = 0; x < p.d; ++x) {
            const double t = dout[Idx(p, p.hq, bi, i, h, x)] *
                             v[Idx(p, p.hkv, bi, j, kvh, x)];
            g += t;
            f += std::fabs(t);
          }
          f *= Gamma(p.d);
          const double ds = w[j] * (g - d_exact);
          const double dp_delta =
              e[j] + lse_err + kU * std::fabs(sigma[j] - lse) + kExp + kU;
          const double hs =
              w[j] * ((dp_delta + 2 * kU) * std::fabs(g - d_exact) + f + dd) +
              r * std::fabs(ds);
          for (int64_t x = 0; x < p.d; ++x) {
            const int64_t qi = Idx(p, p.hq, bi, i, h, x);
            const int64_t kj = Idx(p, p.hkv, bi, j, kvh, x);
            want.dq[qi] += scale * ds * k[kj];
            want.dk[kj] += scale * ds * q[qi];
            want.dv[kj] += w[j] * dout[qi];
            bound.dq[qi] += scale * (hs + Gamma(p.s + 1) * std::fabs(ds)) *
                            std::fabs(k[kj]);
            bound.dk[kj] += scale *
                            (hs + Gamma(p.s * group + 2) * std::fabs(ds)) *
                            std::fabs(q[qi]);
            bound.dv[kj] += w[j] * std::fabs(dout[qi]) *
                            (dp_delta + r + Gamma(p.s * group + 1));
          }
        }
      }
    }
  }
  for (size_t i = 0; i < want.dq.size(); ++i) {
    bound.dq[i] = kSlack * (bound.dq[i] + (kU + kUb) * std::fabs(want.dq[i]));
  }
  for (size_t i = 0; i < want.dk.size(); ++i) {
    bound.dk[i] = kSlack * (bound.dk[i] + (kU + kUb) * std::fabs(want.dk[i]));
    bound.dv[i] = kSlack * (bound.dv[i] + kUb * std::fabs(want.dv[i]));
  }
  // Rows that see no key: lse -inf on both sides.
  std::vector<double> got_lse = got.lse;
  for (size_t i = 0; i < got_lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      EXPECT_TRUE(std::isinf(got_lse[i]) && got_lse[i] < 0) << "lse " << i;
      got_lse[i] = want.lse[i] = 0.0;
    }
  }
  std::printf(
      "%s: worst error / bound: out %.3f lse %.3f dq %.3f dk %.3f "
      "dv %.3f\n",
      path.c_str(), Worst(got.out, want.out, bound.out, "out"),
      Worst(got_lse, want.lse, bound.lse, "lse"),
      Worst(got.dq, want.dq, bound.dq, "dq"),
      Worst(got.dk, want.dk, bound.dk, "dk"),
      Worst(got.dv, want.dv, bound.dv, "dv"));
}

// Both paths on one problem: each within its bound; the dot-product path
// really taken (its results differ from the widened ones), and under
// MCC_CPU_ISA's AVX2 cap the widened kernels run bit for bit.
void CheckBothPaths(const Problem& p, uint32_t seed) {
  const Shape qs{p.b, p.s, p.hq, p.d}, ks{p.b, p.s, p.hkv, p.d};
  Tensor tq = testing::RandomTensor(qs, DType::kBFloat16, seed, -2, 2);
  Tensor tk = testing::RandomTensor(ks, DType::kBFloat16, seed + 1, -2, 2);
  Tensor tv = testing::RandomTensor(ks, DType::kBFloat16, seed + 2);
  Tensor tdout = testing::RandomTensor(qs, DType::kBFloat16, seed + 3);
  const auto q = tq.ToDoubles(), k = tk.ToDoubles(), v = tv.ToDoubles(),
             dout = tdout.ToDoubles();

  const CpuBf16AttentionPath saved =
      internal::SetCpuBf16AttentionPathForTesting(
          CpuBf16AttentionPath::kWidened);
  const Outputs widened = RunKernels(p, tq, tk, tv, tdout);
  CheckBounds(p, q, k, v, dout, widened, 0.0, "widened");

  internal::SetCpuBf16AttentionPathForTesting(
      CpuBf16AttentionPath::kDotProduct);
  // The kernels take the dot-product path only at the AVX-512 kernel ISA
  // (MCC_CPU_ISA=avx2 caps it to the widened one).
  if (CpuBf16AttentionPathInUse() == CpuBf16AttentionPath::kDotProduct &&
      KernelIsa() == CpuIsa::kAvx512) {
    const Outputs dot = RunKernels(p, tq, tk, tv, tdout);
    CheckBounds(p, q, k, v, dout, dot, kUb, "dot product");
    EXPECT_NE(dot.out, widened.out) << "the dot-product path was not taken";
    EXPECT_NE(dot.dk, widened.dk) << "the dot-product path was not taken";
    const CpuIsa isa = internal::SetKernelIsaForTesting(CpuIsa::kAvx2);
    const Outputs capped = RunKernels(p, tq, tk, tv, tdout);
    internal::SetKernelIsaForTesting(isa);
    EXPECT_EQ(capped.out, widened.out) << "AVX2 cap: not the widened path";
    EXPECT_EQ(capped.dq, widened.dq) << "AVX2 cap: not the widened path";
    EXPECT_EQ(capped.dk, widened.dk) << "AVX2 cap: not the widened path";
    EXPECT_EQ(capped.dv, widened.dv) << "AVX2 cap: not the widened path";
  } else {
    std::printf(
        "no AVX512-BF16 on this CPU, or MCC_CPU_ISA=avx2: only the widened "
        "path runs\n");
  }
  internal::SetCpuBf16AttentionPathForTesting(saved);
}

std::vector<int32_t> DocumentFirstKeys(const std::vector<int64_t>& lengths,
                                       int64_t window, int64_t repeat) {
  std::vector<int32_t> first;
  for (int64_t rep = 0; rep < repeat; ++rep) {
    int64_t start = 0;
    for (int64_t n : lengths) {
      for (int64_t t = 0; t < n; ++t) {
        int64_t f = start;
        if (window > 0) f = std::max<int64_t>(f, start + t - window + 1);
        first.push_back(static_cast<int32_t>(f));
      }
      start += n;
    }
  }
  return first;
}

TEST(AttentionBf16PathsTest, CausalGqa) {
  CheckBothPaths({2, 150, 4, 2, 64}, 1);
}

TEST(AttentionBf16PathsTest, FullAttentionOddLengthNarrowHead) {
  // An odd sequence pads the last key and query pairs; d = 24 leaves
  // partial 16-column panels.
  Problem p{1, 67, 2, 1, 24};
  p.causal = false;
  CheckBothPaths(p, 2);
}

TEST(AttentionBf16PathsTest, PackedDocumentsGqa) {
  Problem p{1, 197, 4, 1, 32};
  p.first = DocumentFirstKeys({50, 1, 76, 70}, 0, 1);
  CheckBothPaths(p, 3);
}

TEST(AttentionBf16PathsTest, WindowInsideDocuments) {
  Problem p{2, 160, 2, 2, 128};
  p.first = DocumentFirstKeys({90, 3, 67}, 33, 2);
  CheckBothPaths(p, 4);
}

TEST(AttentionBf16PathsTest, RowsThatSeeNoKey) {
  // A context-parallel ring step: the first rows' documents start after
  // this key chunk.
  Problem p{1, 96, 2, 1, 16};
  p.first = DocumentFirstKeys({96}, 20, 1);
  for (int64_t i = 0; i < 10; ++i) p.first[i] = 1000;
  CheckBothPaths(p, 5);
}

// Attention dropout on the dot-product path draws the widened path's masks
// (checked against float64 in attention_dropout_test): both agree within
// bf16 rounding, where a mask applied differently would differ by O(1).
TEST(AttentionBf16PathsTest, DropoutAgreesWithWidenedPath) {
  const Problem p{1, 130, 2, 1, 64};
  const Shape qs{p.b, p.s, p.hq, p.d}, ks{p.b, p.s, p.hkv, p.d};
  Tensor q = testing::RandomTensor(qs, DType::kBFloat16, 61, -2, 2);
  Tensor k = testing::RandomTensor(ks, DType::kBFloat16, 62, -2, 2);
  Tensor v = testing::RandomTensor(ks, DType::kBFloat16, 63);
  Tensor dout = testing::RandomTensor(qs, DType::kBFloat16, 64);
  AttentionOptions options;
  options.dropout_p = 0.25f;
  options.dropout_seed = 5;
  const std::vector<int32_t> first = DocumentFirstKeys({40, 90}, 0, 1);
  options.first_key =
      Tensor::FromInts(std::vector<int64_t>(first.begin(), first.end()),
                       {p.b, p.s}, DType::kInt32)
          .value();
  auto run = [&](CpuBf16AttentionPath path) {
    const CpuBf16AttentionPath saved =
        internal::SetCpuBf16AttentionPathForTesting(path);
    Tensor out = Tensor::Empty(qs, DType::kBFloat16);
    Tensor lse = Tensor::Empty({p.b, p.hq, p.s}, DType::kFloat32);
    EXPECT_TRUE(FlashAttentionForward(q, k, v, options, &out, &lse).ok());
    Tensor dq = Tensor::Empty(qs, DType::kBFloat16);
    Tensor dk = Tensor::Empty(ks, DType::kBFloat16);
    Tensor dv = Tensor::Empty(ks, DType::kBFloat16);
    EXPECT_TRUE(
        FlashAttentionBackward(q, k, v, out, dout, lse, options, &dq, &dk, &dv)
            .ok());
    internal::SetCpuBf16AttentionPathForTesting(saved);
    return Outputs{out.ToDoubles(), lse.ToDoubles(), dq.ToDoubles(),
                   dk.ToDoubles(), dv.ToDoubles()};
  };
  if (!CpuSupportsAvx512Bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  if (KernelIsa() != CpuIsa::kAvx512) GTEST_SKIP() << "MCC_CPU_ISA=avx2";
  const Outputs widened = run(CpuBf16AttentionPath::kWidened);
  const Outputs dot = run(CpuBf16AttentionPath::kDotProduct);
  testing::ExpectClose(dot.out, widened.out, 2e-2, 2e-2, "out");
  testing::ExpectClose(dot.lse, widened.lse, 1e-5, 1e-5, "lse");
  testing::ExpectClose(dot.dq, widened.dq, 3e-2, 3e-2, "dq");
  testing::ExpectClose(dot.dk, widened.dk, 3e-2, 3e-2, "dk");
  testing::ExpectClose(dot.dv, widened.dv, 3e-2, 3e-2, "dv");
}

}  // namespace
}  // namespace ops
}  // namespace mcc
