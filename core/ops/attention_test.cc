#include "core/ops/attention.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "core/ops/cpu_isa.h"
#include "core/ops/nn_test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectClose;
using testing::NumericGrad;

struct Cfg {
  int64_t b, s, hq, hkv, d;
  bool causal;
};

int64_t Idx(const Cfg& c, int64_t heads, int64_t bi, int64_t t, int64_t h,
            int64_t x) {
  return ((bi * c.s + t) * heads + h) * c.d + x;
}

// Naive full-softmax attention in float64 on [b, s, h, d]; lse [b, hq, s].
std::vector<double> AttnRef(const Cfg& c, const std::vector<double>& q,
                            const std::vector<double>& k,
                            const std::vector<double>& v,
                            std::vector<double>* lse = nullptr) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  std::vector<double> o(c.b * c.s * c.hq * c.d, 0.0);
  if (lse) lse->assign(c.b * c.hq * c.s, 0.0);
  std::vector<double> p(c.s);
  for (int64_t bi = 0; bi < c.b; ++bi) {
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t kvh = h / (c.hq / c.hkv);
      for (int64_t i = 0; i < c.s; ++i) {
        const int64_t n = c.causal ? i + 1 : c.s;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0.0;
          for (int64_t x = 0; x < c.d; ++x) {
            dot +=
                q[Idx(c, c.hq, bi, i, h, x)] * k[Idx(c, c.hkv, bi, j, kvh, x)];
          }
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(p[j] - mx);
        for (int64_t j = 0; j < n; ++j) {
          const double w = std::exp(p[j] - mx) / sum;
          for (int64_t x = 0; x < c.d; ++x) {
            o[Idx(c, c.hq, bi, i, h, x)] += w * v[Idx(c, c.hkv, bi, j, kvh, x)];
          }
        }
        if (lse) (*lse)[(bi * c.hq + h) * c.s + i] = mx + std::log(sum);
      }
    }
  }
  return o;
}

// Analytic float64 backward of the naive attention (checked against finite
// differences by the small cases below).
void AttnGradRef(const Cfg& c, const std::vector<double>& q,
                 const std::vector<double>& k, const std::vector<double>& v,
                 const std::vector<double>& dout, std::vector<double>* dq,
                 std::vector<double>* dk, std::vector<double>* dv) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  dq->assign(q.size(), 0.0);
  dk->assign(k.size(), 0.0);
  dv->assign(v.size(), 0.0);
  std::vector<double> p(c.s), dp(c.s);
  for (int64_t bi = 0; bi < c.b; ++bi) {
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t kvh = h / (c.hq / c.hkv);
      for (int64_t i = 0; i < c.s; ++i) {
        const int64_t n = c.causal ? i + 1 : c.s;
        double mx = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0.0;
          for (int64_t x = 0; x < c.d; ++x) {
            dot +=
                q[Idx(c, c.hq, bi, i, h, x)] * k[Idx(c, c.hkv, bi, j, kvh, x)];
          }
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(p[j] - mx);
        double pdp = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          p[j] = std::exp(p[j] - mx) / sum;
          double g = 0.0;
          for (int64_t x = 0; x < c.d; ++x) {
            g += dout[Idx(c, c.hq, bi, i, h, x)] *
                 v[Idx(c, c.hkv, bi, j, kvh, x)];
          }
          dp[j] = g;
          pdp += p[j] * g;
        }
        for (int64_t j = 0; j < n; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * scale;
          for (int64_t x = 0; x < c.d; ++x) {
            (*dv)[Idx(c, c.hkv, bi, j, kvh, x)] +=
                p[j] * dout[Idx(c, c.hq, bi, i, h, x)];
            (*dq)[Idx(c, c.hq, bi, i, h, x)] +=
                ds * k[Idx(c, c.hkv, bi, j, kvh, x)];
            (*dk)[Idx(c, c.hkv, bi, j, kvh, x)] +=
                ds * q[Idx(c, c.hq, bi, i, h, x)];
          }
        }
      }
    }
  }
}

struct AttnRun {
  Tensor q, k, v, out, lse, dout, dq, dk, dv;
};

AttnRun RunKernel(const Cfg& c, DType dtype, uint32_t seed) {
  AttnRun r;
  const Shape qs = {c.b, c.s, c.hq, c.d}, ks = {c.b, c.s, c.hkv, c.d};
  r.q = testing::RandomTensor(qs, dtype, seed, -2, 2);
  r.k = testing::RandomTensor(ks, dtype, seed + 1, -2, 2);
  r.v = testing::RandomTensor(ks, dtype, seed + 2);
  r.dout = testing::RandomTensor(qs, dtype, seed + 3);
  r.out = Tensor::Full(qs, 5.0, dtype);
  r.lse = Tensor::Full({c.b, c.hq, c.s}, 5.0, DType::kFloat32);
  r.dq = Tensor::Full(qs, 5.0, dtype);
  r.dk = Tensor::Full(ks, 5.0, dtype);
  r.dv = Tensor::Full(ks, 5.0, dtype);
  AttentionOptions opt;
  opt.causal = c.causal;
  EXPECT_TRUE(FlashAttentionForward(r.q, r.k, r.v, opt, &r.out, &r.lse).ok());
  EXPECT_TRUE(FlashAttentionBackward(r.q, r.k, r.v, r.out, r.dout, r.lse, opt,
                                     &r.dq, &r.dk, &r.dv)
                  .ok());
  return r;
}

class AttentionTest : public ::testing::TestWithParam<Cfg> {};

// Small sizes: forward against the naive reference, gradients against
// central finite differences of it.
TEST_P(AttentionTest, MatchesNaiveReferenceAndFiniteDifferences) {
  const Cfg c = GetParam();
  AttnRun r = RunKernel(c, DType::kFloat32, 17 + c.s + c.d);
  const auto qd = r.q.ToDoubles(), kd = r.k.ToDoubles(), vd = r.v.ToDoubles(),
             wd = r.dout.ToDoubles();
  std::vector<double> lse_ref;
  ExpectClose(r.out.ToDoubles(), AttnRef(c, qd, kd, vd, &lse_ref), 2e-5, 2e-5,
              "out");
  ExpectClose(r.lse.ToDoubles(), lse_ref, 2e-5, 2e-5, "lse");
  auto loss = [&](const std::vector<double>& o) {
    double acc = 0.0;
    for (size_t i = 0; i < o.size(); ++i) acc += o[i] * wd[i];
    return acc;
  };
  const auto gq = NumericGrad(qd, [&](const std::vector<double>& x) {
    return loss(AttnRef(c, x, kd, vd));
  });
  const auto gk = NumericGrad(kd, [&](const std::vector<double>& x) {
    return loss(AttnRef(c, qd, x, vd));
  });
  const auto gv = NumericGrad(vd, [&](const std::vector<double>& x) {
    return loss(AttnRef(c, qd, kd, x));
  });
  ExpectClose(r.dq.ToDoubles(), gq, 1e-4, 1e-4, "dq");
  ExpectClose(r.dk.ToDoubles(), gk, 1e-4, 1e-4, "dk");
  ExpectClose(r.dv.ToDoubles(), gv, 1e-4, 1e-4, "dv");
  // The analytic reference used for larger sizes agrees too.
  std::vector<double> aq, ak, av;
  AttnGradRef(c, qd, kd, vd, wd, &aq, &ak, &av);
  ExpectClose(aq, gq, 1e-6, 1e-6, "analytic dq");
  ExpectClose(ak, gk, 1e-6, 1e-6, "analytic dk");
}

INSTANTIATE_TEST_SUITE_P(Small, AttentionTest,
                         ::testing::Values(Cfg{1, 1, 1, 1, 8, true},
                                           Cfg{2, 5, 2, 1, 8, true},
                                           Cfg{1, 67, 2, 1, 8, true},
                                           Cfg{1, 33, 2, 2, 24, true},
                                           Cfg{1, 67, 1, 1, 8, false}));

// Larger: several blocks, partial last block, GQA, against the analytic
// float64 reference.
TEST(AttentionLargeTest, MatchesAnalyticReference) {
  for (const Cfg& c : {Cfg{2, 130, 4, 2, 24, true}, Cfg{1, 200, 3, 1, 40, true},
                       Cfg{1, 130, 2, 2, 24, false}}) {
    AttnRun r = RunKernel(c, DType::kFloat32, 99);
    const auto qd = r.q.ToDoubles(), kd = r.k.ToDoubles(), vd = r.v.ToDoubles(),
               wd = r.dout.ToDoubles();
    ExpectClose(r.out.ToDoubles(), AttnRef(c, qd, kd, vd), 2e-5, 2e-5, "out");
    std::vector<double> aq, ak, av;
    AttnGradRef(c, qd, kd, vd, wd, &aq, &ak, &av);
    ExpectClose(r.dq.ToDoubles(), aq, 1e-4, 1e-4, "dq");
    ExpectClose(r.dk.ToDoubles(), ak, 1e-4, 1e-4, "dk");
    ExpectClose(r.dv.ToDoubles(), av, 1e-4, 1e-4, "dv");
  }
}

// bf16 in and out, fp32 math: within bf16 rounding of the outputs.
TEST(AttentionBf16Test, WithinBf16Tolerance) {
  const Cfg c{1, 90, 2, 1, 24, true};
  AttnRun r = RunKernel(c, DType::kBFloat16, 7);
  const auto qd = r.q.ToDoubles(), kd = r.k.ToDoubles(), vd = r.v.ToDoubles(),
             wd = r.dout.ToDoubles();
  ExpectClose(r.out.ToDoubles(), AttnRef(c, qd, kd, vd), 1e-2, 1e-2,
              "out bf16");
  std::vector<double> aq, ak, av;
  AttnGradRef(c, qd, kd, vd, wd, &aq, &ak, &av);
  // The backward also sees the bf16-rounded out (D = rowsum(dout * out)).
  ExpectClose(r.dq.ToDoubles(), aq, 3e-2, 3e-2, "dq bf16");
  ExpectClose(r.dk.ToDoubles(), ak, 3e-2, 3e-2, "dk bf16");
  ExpectClose(r.dv.ToDoubles(), av, 3e-2, 3e-2, "dv bf16");
}

// fp16 in and out: as bf16 with 11 significant bits, tolerances 8x tighter.
TEST(AttentionFp16Test, WithinFp16Tolerance) {
  const Cfg c{1, 90, 2, 1, 24, true};
  AttnRun r = RunKernel(c, DType::kFloat16, 7);
  const auto qd = r.q.ToDoubles(), kd = r.k.ToDoubles(), vd = r.v.ToDoubles(),
             wd = r.dout.ToDoubles();
  ExpectClose(r.out.ToDoubles(), AttnRef(c, qd, kd, vd), 1.25e-3, 1.25e-3,
              "out fp16");
  std::vector<double> aq, ak, av;
  AttnGradRef(c, qd, kd, vd, wd, &aq, &ak, &av);
  ExpectClose(r.dq.ToDoubles(), aq, 4e-3, 4e-3, "dq fp16");
  ExpectClose(r.dk.ToDoubles(), ak, 4e-3, 4e-3, "dk fp16");
  ExpectClose(r.dv.ToDoubles(), av, 4e-3, 4e-3, "dv fp16");
}

// Peak allocator bytes during forward + backward grow linearly in T.
// The AVX-512 block GEMMs run the same FMA chains as the AVX2 ones, so
// every output is bit-identical; head sizes and lengths cover full and
// partial 16- and 32-column panels and 8-row tails. bf16 takes the widened
// path here (the dot-product path has AVX-512 only: attention_bf16_test).
TEST(AttentionIsaTest, Avx512AndAvx2AgreeBitForBit) {
  if (!CpuSupportsAvx512()) {
    std::printf("no AVX-512 on this CPU: only the AVX2 kernels run\n");
    GTEST_SKIP() << "no AVX-512 on this CPU";
  }
  const CpuBf16AttentionPath saved_path =
      internal::SetCpuBf16AttentionPathForTesting(
          CpuBf16AttentionPath::kWidened);
  const Cfg cfgs[] = {{1, 67, 2, 1, 24, true},
                      {2, 130, 2, 2, 64, true},
                      {1, 75, 1, 1, 40, false},
                      {1, 64, 3, 1, 80, true}};
  for (const Cfg& c : cfgs) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      const CpuIsa saved = internal::SetKernelIsaForTesting(CpuIsa::kAvx2);
      AttnRun narrow = RunKernel(c, dt, 91);
      internal::SetKernelIsaForTesting(CpuIsa::kAvx512);
      AttnRun wide = RunKernel(c, dt, 91);
      internal::SetKernelIsaForTesting(saved);
      const std::string what = ::testing::PrintToString(
          std::make_tuple(c.b, c.s, c.hq, c.hkv, c.d, c.causal, DTypeName(dt)));
      EXPECT_EQ(narrow.out.ToDoubles(), wide.out.ToDoubles()) << what;
      EXPECT_EQ(narrow.lse.ToDoubles(), wide.lse.ToDoubles()) << what;
      EXPECT_EQ(narrow.dq.ToDoubles(), wide.dq.ToDoubles()) << what;
      EXPECT_EQ(narrow.dk.ToDoubles(), wide.dk.ToDoubles()) << what;
      EXPECT_EQ(narrow.dv.ToDoubles(), wide.dv.ToDoubles()) << what;
    }
  }
  internal::SetCpuBf16AttentionPathForTesting(saved_path);
}

TEST(AttentionMemoryTest, PeakGrowsLinearlyWithSequence) {
  auto peak_for = [](int64_t s) {
    // One kv head: the backward is one task, so the peak does not depend on
    // how the threads happen to overlap.
    const Cfg c{1, s, 2, 1, 32, true};
    const Shape qs = {c.b, c.s, c.hq, c.d}, ks = {c.b, c.s, c.hkv, c.d};
    Tensor q = testing::RandomTensor(qs, DType::kFloat32, 1);
    Tensor k = testing::RandomTensor(ks, DType::kFloat32, 2);
    Tensor v = testing::RandomTensor(ks, DType::kFloat32, 3);
    Tensor dout = testing::RandomTensor(qs, DType::kFloat32, 4);
    Tensor out = Tensor::Empty(qs, DType::kFloat32);
    Tensor lse = Tensor::Empty({1, 2, s}, DType::kFloat32);
    Tensor dq = Tensor::Empty(qs, DType::kFloat32);
    Tensor dk = Tensor::Empty(ks, DType::kFloat32);
    Tensor dv = Tensor::Empty(ks, DType::kFloat32);
    Allocator* alloc = GetAllocator(Device::CPU());
    const int64_t base = alloc->Stats().current_bytes;
    alloc->ResetPeak();
    EXPECT_TRUE(FlashAttentionForward(q, k, v, {}, &out, &lse).ok());
    EXPECT_TRUE(
        FlashAttentionBackward(q, k, v, out, dout, lse, {}, &dq, &dk, &dv)
            .ok());
    return alloc->Stats().peak_bytes - base;
  };
  const int64_t p256 = peak_for(256);
  const int64_t p1024 = peak_for(1024);
  // Quadratic growth would be 16x; one fp32 T x T matrix per head would
  // alone be 4 MiB at T = 1024.
  EXPECT_GT(p256, 0);
  EXPECT_LE(p1024, 5 * p256) << p256 << " -> " << p1024;
  EXPECT_LT(p1024, 1024 * 1024 * 4) << p1024;
}

TEST(AttentionErrorsTest, BadShapesNameBothAndLeaveOutputsAlone) {
  Tensor q = Tensor::Full({2, 5, 4, 8}, 0.5, DType::kFloat32);
  Tensor k = Tensor::Full({2, 5, 3, 8}, 0.5, DType::kFloat32);
  Tensor out = Tensor::Full({2, 5, 4, 8}, 5.0, DType::kFloat32);
  Tensor lse = Tensor::Full({2, 4, 5}, 5.0, DType::kFloat32);
  absl::Status s = FlashAttentionForward(q, k, k, {}, &out, &lse);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[2, 5, 4, 8]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[2, 5, 3, 8]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(out, 5.0));
  EXPECT_TRUE(testing::AllEqual(lse, 5.0));

  Tensor k2 = Tensor::Full({2, 5, 2, 8}, 0.5, DType::kFloat32);
  Tensor lse_bad = Tensor::Full({2, 5, 4}, 5.0, DType::kFloat32);
  s = FlashAttentionForward(q, k2, k2, {}, &out, &lse_bad);
  EXPECT_NE(s.message().find("[2, 5, 4]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[2, 4, 5]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(out, 5.0));

  Tensor dq = Tensor::Full({2, 5, 4, 8}, 5.0, DType::kFloat32);
  Tensor dk = Tensor::Full({2, 5, 2, 8}, 5.0, DType::kFloat32);
  Tensor dv_bad = Tensor::Full({2, 5, 4, 8}, 5.0, DType::kFloat32);
  s = FlashAttentionBackward(q, k2, k2, out, out, lse, {}, &dq, &dk, &dv_bad);
  EXPECT_NE(s.message().find("dv"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[2, 5, 2, 8]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(dq, 5.0));
  EXPECT_TRUE(testing::AllEqual(dk, 5.0));
}

TEST(AttentionTestDevice, MatchesCpuBitForBit) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const int64_t b = 2, s = 37, h = 4, hkv = 2, d = 16;
    Tensor q = testing::RandomTensor({b, s, h, d}, dt, 1);
    Tensor k = testing::RandomTensor({b, s, hkv, d}, dt, 2);
    Tensor v = testing::RandomTensor({b, s, hkv, d}, dt, 3);
    Tensor out = Tensor::Zeros({b, s, h, d}, dt);
    Tensor lse = Tensor::Zeros({b, h, s}, DType::kFloat32);
    for (float p : {0.0f, 0.25f}) {
      AttentionOptions options;
      options.dropout_p = p;
      options.dropout_seed = 11;
      auto fwd = testing::ExpectSameOnTestDevice(
          {q, k, v, out, lse}, [&](std::vector<Tensor>& t) {
            return FlashAttentionForward(t[0], t[1], t[2], options, &t[3],
                                         &t[4]);
          });
      Tensor dout = testing::RandomTensor({b, s, h, d}, dt, 4);
      Tensor dq = Tensor::Zeros({b, s, h, d}, dt);
      Tensor dk = Tensor::Zeros({b, s, hkv, d}, dt);
      Tensor dv = Tensor::Zeros({b, s, hkv, d}, dt);
      testing::ExpectSameOnTestDevice(
          {q, k, v, fwd[3], dout, fwd[4], dq, dk, dv},
          [&](std::vector<Tensor>& t) {
            return FlashAttentionBackward(t[0], t[1], t[2], t[3], t[4], t[5],
                                          options, &t[6], &t[7], &t[8]);
          });
    }
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
