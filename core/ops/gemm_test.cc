#include "core/ops/gemm.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>
#include <tuple>
#include <vector>

#include "core/ops/test_util.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::Bytes;
using testing::RandomTensor;

// Element (i, j) of op(X) for a row-major X with leading dimension ld.
double At(const std::vector<double>& x, bool trans, int64_t ld, int64_t i,
          int64_t j) {
  return trans ? x[j * ld + i] : x[i * ld + j];
}

// float64 reference: returns alpha * op(A) op(B) + beta * C and, per element,
// alpha * sum |a||b| + |beta c| (the scale of the rounding error).
void RefGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
             const std::vector<double>& a, int64_t lda,
             const std::vector<double>& b, int64_t ldb, double beta,
             const std::vector<double>& c, int64_t ldc,
             std::vector<double>* out, std::vector<double>* scale) {
  out->assign(c.begin(), c.end());
  scale->assign(c.size(), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, sa = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double v = At(a, ta, lda, i, p) * At(b, tb, ldb, p, j);
        s += v;
        sa += std::fabs(v);
      }
      const double c0 = beta == 0 ? 0.0 : c[i * ldc + j];
      (*out)[i * ldc + j] = alpha * s + beta * c0;
      (*scale)[i * ldc + j] = std::fabs(alpha) * sa + std::fabs(beta * c0);
    }
  }
}

void ExpectWithin(const std::vector<double>& got,
                  const std::vector<double>& want,
                  const std::vector<double>& scale, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rel * scale[i] + 1e-30;
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << " element " << i << ": got " << got[i]
                    << " want " << want[i] << " tol " << tol;
      if (++failures > 4) return;
    }
  }
}

// fp32 accumulation over k terms: each partial sum rounds with relative error
// 2^-24, so |error| <= k * 2^-24 * sum|a b| (a loose bound; oneDNN blocks
// its sums, so real errors are far smaller).
double F32Tol(int64_t k) { return (k + 2) * std::ldexp(1.0, -24); }

// bf16 keeps 8 significant bits (7 stored + the implicit one), so its unit
// roundoff is 2^-8: rounding an input changes it by at most 2^-8 relative, a
// product of two rounded inputs by at most 2^-7 + 2^-16, so against the
// unrounded fp32 inputs |error| <= (2^-7 + 2^-16) * sum|a b| + the fp32
// accumulation error.
double Bf16InputTol(int64_t k) {
  return std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + F32Tol(k);
}

class RawGemmTest
    : public ::testing::TestWithParam<std::tuple<bool, bool, int, bool>> {};

TEST_P(RawGemmTest, MatchesFloat64Reference) {
  const bool ta = std::get<0>(GetParam());
  const bool tb = std::get<1>(GetParam());
  const int size_case = std::get<2>(GetParam());
  const bool force_matmul = std::get<3>(GetParam());
  const bool saved = internal::SetForceMatmulPrimitiveForTesting(force_matmul);
  const int64_t sizes[][3] = {{1, 1, 1},    {7, 33, 1},   {33, 7, 129},
                              {129, 33, 7}, {1, 129, 33}, {65, 70, 300}};
  const int64_t m = sizes[size_case][0], n = sizes[size_case][1],
                k = sizes[size_case][2];
  // Leading dimensions larger than the rows need, to exercise strides.
  const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
  const int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
  uint32_t seed = 100 * size_case + 10 * ta + tb;
  for (float alpha : {1.0f, -0.5f}) {
    for (float beta : {0.0f, 1.0f, 0.25f}) {
      for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        Tensor a = RandomTensor({a_rows, lda}, dt, ++seed);
        Tensor b = RandomTensor({b_rows, ldb}, dt, ++seed);
        Tensor c = RandomTensor({m, ldc}, DType::kFloat32, ++seed);
        if (beta == 0.0f) c.Fill(std::numeric_limits<double>::quiet_NaN());
        std::vector<double> want, scale;
        RefGemm(ta, tb, m, n, k, alpha, a.ToDoubles(), lda, b.ToDoubles(), ldb,
                beta, c.ToDoubles(), ldc, &want, &scale);
        if (dt == DType::kFloat32) {
          GemmF32(ta, tb, m, n, k, alpha, a.data<float>(), lda, b.data<float>(),
                  ldb, beta, c.data<float>(), ldc);
        } else if (dt == DType::kBFloat16) {
          GemmBF16(ta, tb, m, n, k, alpha, a.data<BFloat16>(), lda,
                   b.data<BFloat16>(), ldb, beta, c.data<float>(), ldc);
        } else {
          GemmF16(ta, tb, m, n, k, alpha, a.data<Float16>(), lda,
                  b.data<Float16>(), ldb, beta, c.data<float>(), ldc);
        }
        std::vector<double> got = c.ToDoubles();
        // Padding columns of c (j >= n) must be unchanged: compare them too
        // (the reference copies them); with beta == 0 they hold NaN.
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = n; j < ldc; ++j) {
            if (std::isnan(want[i * ldc + j])) {
              EXPECT_TRUE(std::isnan(got[i * ldc + j]));
              got[i * ldc + j] = want[i * ldc + j] = 0;
            }
          }
        }
        ExpectWithin(got, want, scale, F32Tol(k),
                     ::testing::PrintToString(std::make_tuple(
                         DTypeName(dt), m, n, k, ta, tb, alpha, beta)));
      }
    }
  }
  internal::SetForceMatmulPrimitiveForTesting(saved);
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, RawGemmTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Bool(),
                                            ::testing::Range(0, 6),
                                            ::testing::Bool()));

TEST(GemmTest, Bf16WidenedInPanelsMatchesReference) {
  // Panels of 100 elements: several m- and n-panels, ragged last ones.
  const int64_t saved = internal::SetBf16WidenPanelForTesting(100);
  const int64_t m = 33, n = 29, k = 7;
  uint32_t seed = 500;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
      Tensor a = RandomTensor({ta ? k : m, lda}, DType::kBFloat16, ++seed);
      Tensor b = RandomTensor({tb ? n : k, ldb}, DType::kBFloat16, ++seed);
      Tensor c = RandomTensor({m, ldc}, DType::kFloat32, ++seed);
      std::vector<double> want, scale;
      RefGemm(ta, tb, m, n, k, 1.5, a.ToDoubles(), lda, b.ToDoubles(), ldb, 0.5,
              c.ToDoubles(), ldc, &want, &scale);
      GemmBF16(ta, tb, m, n, k, 1.5f, a.data<BFloat16>(), lda,
               b.data<BFloat16>(), ldb, 0.5f, c.data<float>(), ldc);
      ExpectWithin(c.ToDoubles(), want, scale, F32Tol(k),
                   ::testing::PrintToString(std::make_tuple(ta, tb)));
    }
  }
  internal::SetBf16WidenPanelForTesting(saved);
}

TEST(GemmTest, Fp16WidenedInPanelsMatchesReference) {
  // The fp16 path shares the bf16 panel widening; panels of 100 elements.
  const int64_t saved = internal::SetBf16WidenPanelForTesting(100);
  const int64_t m = 33, n = 29, k = 7;
  uint32_t seed = 600;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
      Tensor a = RandomTensor({ta ? k : m, lda}, DType::kFloat16, ++seed);
      Tensor b = RandomTensor({tb ? n : k, ldb}, DType::kFloat16, ++seed);
      Tensor c = RandomTensor({m, ldc}, DType::kFloat32, ++seed);
      std::vector<double> want, scale;
      RefGemm(ta, tb, m, n, k, 1.5, a.ToDoubles(), lda, b.ToDoubles(), ldb, 0.5,
              c.ToDoubles(), ldc, &want, &scale);
      GemmF16(ta, tb, m, n, k, 1.5f, a.data<Float16>(), lda, b.data<Float16>(),
              ldb, 0.5f, c.data<float>(), ldc);
      ExpectWithin(c.ToDoubles(), want, scale, F32Tol(k),
                   ::testing::PrintToString(std::make_tuple(ta, tb)));
    }
  }
  internal::SetBf16WidenPanelForTesting(saved);
}

TEST(GemmTest, MatmulPrimitivesAreCachedPerShape) {
  const bool saved = internal::SetForceMatmulPrimitiveForTesting(true);
  Tensor a = RandomTensor({9, 11}, DType::kFloat32, 1);
  Tensor b = RandomTensor({11, 13}, DType::kFloat32, 2);
  Tensor c = Tensor::Zeros({9, 13}, DType::kFloat32);
  ASSERT_TRUE(Gemm(a, false, b, false, &c).ok());
  const int64_t created = internal::MatmulPrimitivesCreated();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Gemm(a, false, b, false, &c).ok());
  EXPECT_EQ(internal::MatmulPrimitivesCreated(), created);
  ASSERT_TRUE(Gemm(a, false, b, false, &c, 1.0f, 1.0f).ok());  // New beta.
  EXPECT_EQ(internal::MatmulPrimitivesCreated(), created + 1);
  internal::SetForceMatmulPrimitiveForTesting(saved);
}

TEST(GemmTest, TensorGemmBf16AgainstUnroundedInputs) {
  // Inputs drawn in fp32, rounded to bf16, multiplied; compared with the
  // float64 product of the unrounded fp32 values.
  const int64_t m = 33, n = 17, k = 129;
  Tensor a32 = RandomTensor({m, k}, DType::kFloat32, 7);
  Tensor b32 = RandomTensor({n, k}, DType::kFloat32, 8);
  Tensor a16 = a32.To(DType::kBFloat16).value();
  Tensor b16 = b32.To(DType::kBFloat16).value();
  Tensor c = Tensor::Zeros({m, n}, DType::kFloat32);
  ASSERT_TRUE(Gemm(a16, false, b16, true, &c).ok());
  std::vector<double> want, scale;
  RefGemm(false, true, m, n, k, 1, a32.ToDoubles(), k, b32.ToDoubles(), k, 0,
          std::vector<double>(m * n), n, &want, &scale);
  ExpectWithin(c.ToDoubles(), want, scale, Bf16InputTol(k), "bf16 gemm");

  // bf16 output: one more rounding of the result, |error| <= 2^-8 |c|.
  Tensor c16 = Tensor::Zeros({m, n}, DType::kBFloat16);
  ASSERT_TRUE(Gemm(a16, false, b16, true, &c16).ok());
  std::vector<double> got = c16.ToDoubles();
  for (size_t i = 0; i < got.size(); ++i) scale[i] += std::fabs(want[i]);
  ExpectWithin(got, want, scale, Bf16InputTol(k) + std::ldexp(1.0, -8),
               "bf16 gemm, bf16 output");
}

TEST(GemmTest, TensorGemmFp16AgainstUnroundedInputs) {
  // As the bf16 case: fp16 has 11 significant bits, so each input carries a
  // relative rounding error of at most 2^-11 and the output one more.
  const int64_t m = 33, n = 17, k = 129;
  Tensor a32 = RandomTensor({m, k}, DType::kFloat32, 7);
  Tensor b32 = RandomTensor({n, k}, DType::kFloat32, 8);
  Tensor a16 = a32.To(DType::kFloat16).value();
  Tensor b16 = b32.To(DType::kFloat16).value();
  Tensor c = Tensor::Zeros({m, n}, DType::kFloat32);
  ASSERT_TRUE(Gemm(a16, false, b16, true, &c).ok());
  std::vector<double> want, scale;
  RefGemm(false, true, m, n, k, 1, a32.ToDoubles(), k, b32.ToDoubles(), k, 0,
          std::vector<double>(m * n), n, &want, &scale);
  const double input_tol =
      std::ldexp(1.0, -10) + std::ldexp(1.0, -22) + F32Tol(k);
  ExpectWithin(c.ToDoubles(), want, scale, input_tol, "fp16 gemm");

  Tensor c16 = Tensor::Zeros({m, n}, DType::kFloat16);
  ASSERT_TRUE(Gemm(a16, false, b16, true, &c16).ok());
  std::vector<double> got = c16.ToDoubles();
  for (size_t i = 0; i < got.size(); ++i) scale[i] += std::fabs(want[i]);
  ExpectWithin(got, want, scale, input_tol + std::ldexp(1.0, -11),
               "fp16 gemm, fp16 output");

  // fp16 c with beta accumulates through fp32.
  Tensor c2 = RandomTensor({m, n}, DType::kFloat16, 9);
  std::vector<double> want2, scale2;
  RefGemm(false, true, m, n, k, 1, a16.ToDoubles(), k, b16.ToDoubles(), k, 1,
          c2.ToDoubles(), n, &want2, &scale2);
  ASSERT_TRUE(Gemm(a16, false, b16, true, &c2, 1.0f, 1.0f).ok());
  for (size_t i = 0; i < scale2.size(); ++i) scale2[i] += std::fabs(want2[i]);
  ExpectWithin(c2.ToDoubles(), want2, scale2, std::ldexp(1.0, -11) + F32Tol(k),
               "fp16 c, beta 1");
}

TEST(GemmTest, Bf16OutputWithBetaAccumulates) {
  const int64_t m = 7, n = 9, k = 5;
  Tensor a = RandomTensor({m, k}, DType::kFloat32, 3);
  Tensor b = RandomTensor({k, n}, DType::kFloat32, 4);
  Tensor c = RandomTensor({m, n}, DType::kBFloat16, 5);
  std::vector<double> want, scale;
  RefGemm(false, false, m, n, k, 2, a.ToDoubles(), k, b.ToDoubles(), n, 1,
          c.ToDoubles(), n, &want, &scale);
  ASSERT_TRUE(Gemm(a, false, b, false, &c, 2.0f, 1.0f).ok());
  for (size_t i = 0; i < scale.size(); ++i) scale[i] += std::fabs(want[i]);
  ExpectWithin(c.ToDoubles(), want, scale, std::ldexp(1.0, -8) + F32Tol(k),
               "bf16 c");
}

TEST(GemmTest, BatchedMatchesPerEntryReference) {
  for (bool shared_b : {false, true}) {
    for (int64_t size : {5, 129}) {  // Small: parallel over the batch.
      for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        const int64_t batch = 3, m = size, n = 7, k = size + 1;
        Tensor a = RandomTensor({batch, k, m}, dt, 11);  // trans_a
        Tensor b = shared_b ? RandomTensor({k, n}, dt, 12)
                            : RandomTensor({batch, k, n}, dt, 12);
        Tensor c = RandomTensor({batch, m, n}, DType::kFloat32, 13);
        const std::vector<double> av = a.ToDoubles(), bv = b.ToDoubles(),
                                  cv = c.ToDoubles();
        ASSERT_TRUE(BatchedGemm(a, true, b, false, &c, 1.0f, 0.5f).ok());
        const std::vector<double> got = c.ToDoubles();
        for (int64_t e = 0; e < batch; ++e) {
          std::vector<double> ae(av.begin() + e * k * m,
                                 av.begin() + (e + 1) * k * m);
          std::vector<double> be =
              shared_b ? bv
                       : std::vector<double>(bv.begin() + e * k * n,
                                             bv.begin() + (e + 1) * k * n);
          std::vector<double> ce(cv.begin() + e * m * n,
                                 cv.begin() + (e + 1) * m * n);
          std::vector<double> ge(got.begin() + e * m * n,
                                 got.begin() + (e + 1) * m * n);
          std::vector<double> want, scale;
          RefGemm(true, false, m, n, k, 1, ae, m, be, n, 0.5, ce, n, &want,
                  &scale);
          ExpectWithin(ge, want, scale, F32Tol(k), "batched entry");
        }
      }
    }
  }
}

TEST(GemmTest, ParameterGradientAccumulates) {
  // dW += dY^T X twice equals 2 dY^T X (gradient-accumulation fusion).
  Tensor dy = RandomTensor({33, 7}, DType::kBFloat16, 21);
  Tensor x = RandomTensor({33, 5}, DType::kBFloat16, 22);
  Tensor dw = Tensor::Zeros({7, 5}, DType::kFloat32);
  Tensor once = Tensor::Zeros({7, 5}, DType::kFloat32);
  ASSERT_TRUE(Gemm(dy, true, x, false, &once).ok());
  ASSERT_TRUE(Gemm(dy, true, x, false, &dw, 1, 1).ok());
  ASSERT_TRUE(Gemm(dy, true, x, false, &dw, 1, 1).ok());
  const std::vector<double> a = once.ToDoubles(), b = dw.ToDoubles();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], 2 * a[i], 1e-5);
}

TEST(GemmTest, ThreadCountDoesNotChangeResults) {
  Tensor a = RandomTensor({64, 96}, DType::kFloat32, 31);
  Tensor b = RandomTensor({96, 80}, DType::kFloat32, 32);
  Tensor c1 = Tensor::Zeros({64, 80}, DType::kFloat32);
  Tensor c2 = Tensor::Zeros({64, 80}, DType::kFloat32);
  const int threads = ThreadPool::Global().num_threads();
  ThreadPool::SetGlobalThreads(1);
  ASSERT_TRUE(Gemm(a, false, b, false, &c1).ok());
  ThreadPool::SetGlobalThreads(threads);
  ASSERT_TRUE(Gemm(a, false, b, false, &c2).ok());
  testing::ExpectAllNear(c1.ToDoubles(), c2.ToDoubles(), 1e-5, 1e-5,
                         "1 thread vs many");
}

// Threads running one shape at once share its cached oneDNN primitive, each
// with its own scratchpad: every thread's results must be exactly what the
// same call gives alone (one oneDNN thread a call, so the sums' order is
// fixed). fp32 through the forced matmul-primitive path on every CPU, bf16
// on the native path where the CPU has it. k is long, so the kernels keep
// partial sums in the scratchpad.
TEST(GemmTest, ThreadsSharingAPrimitiveGetTheirOwnExactResults) {
  const bool saved_force = internal::SetForceMatmulPrimitiveForTesting(true);
  const Bf16PathPolicy saved_policy =
      internal::SetBf16PathPolicyForTesting(Bf16PathPolicy::kNative);
  const int saved_threads = ThreadPool::Global().num_threads();
  ThreadPool::SetGlobalThreads(1);
  std::vector<DType> dtypes = {DType::kFloat32};
  if (NativeBf16Available()) dtypes.push_back(DType::kBFloat16);
  const int64_t m = 96, n = 80, k = 2048;
  constexpr int kThreads = 4, kRounds = 20;
  for (DType dtype : dtypes) {
    std::vector<Tensor> a, b, alone;
    for (int w = 0; w < kThreads; ++w) {
      a.push_back(RandomTensor({m, k}, dtype, 700 + 2 * w));
      b.push_back(RandomTensor({k, n}, dtype, 701 + 2 * w));
      alone.push_back(Tensor::Zeros({m, n}, DType::kFloat32));
      ASSERT_TRUE(Gemm(a[w], false, b[w], false, &alone[w]).ok());
    }
    std::vector<int> mismatches(kThreads, 0);
    std::vector<std::thread> threads;
    for (int w = 0; w < kThreads; ++w) {
      threads.emplace_back([&, w] {
        Tensor c = Tensor::Zeros({m, n}, DType::kFloat32);
        for (int r = 0; r < kRounds; ++r) {
          if (!Gemm(a[w], false, b[w], false, &c).ok() ||
              Bytes(c) != Bytes(alone[w])) {
            ++mismatches[w];
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int w = 0; w < kThreads; ++w) {
      EXPECT_EQ(mismatches[w], 0)
          << DTypeName(dtype) << ", thread " << w << ": " << mismatches[w]
          << " of " << kRounds
          << " concurrent calls differ from the call alone";
    }
  }
  ThreadPool::SetGlobalThreads(saved_threads);
  internal::SetBf16PathPolicyForTesting(saved_policy);
  internal::SetForceMatmulPrimitiveForTesting(saved_force);
}

// Restores the bf16 path policy and forgets measured choices on exit.
class ScopedBf16Policy {
 public:
  explicit ScopedBf16Policy(Bf16PathPolicy policy)
      : saved_(internal::SetBf16PathPolicyForTesting(policy)) {
    internal::ClearBf16GemmChoicesForTesting();
  }
  ~ScopedBf16Policy() {
    internal::SetBf16PathPolicyForTesting(saved_);
    internal::ClearBf16GemmChoicesForTesting();
  }

 private:
  Bf16PathPolicy saved_;
};

// Both bf16 paths, pinned, on every transpose with beta = 0 and 1: same
// float64 reference and bound as RawGemmTest (bf16 products are exact in
// fp32, so only the fp32 accumulation rounds).
TEST(GemmTest, EachBf16PathMatchesReference) {
  std::vector<Bf16PathPolicy> policies = {Bf16PathPolicy::kWidened};
  if (NativeBf16Available()) {
    policies.push_back(Bf16PathPolicy::kNative);
  } else {
    std::printf("no native bf16 on this CPU: only the widened path runs\n");
  }
  const int64_t m = 70, n = 65, k = 300;
  uint32_t seed = 500;
  for (Bf16PathPolicy policy : policies) {
    ScopedBf16Policy scoped(policy);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          const int64_t lda = ta ? m : k, ldb = tb ? k : n;
          Tensor a = RandomTensor({ta ? k : m, lda}, DType::kBFloat16, ++seed);
          Tensor b = RandomTensor({tb ? n : k, ldb}, DType::kBFloat16, ++seed);
          Tensor c = RandomTensor({m, n}, DType::kFloat32, ++seed);
          std::vector<double> want, scale;
          RefGemm(ta, tb, m, n, k, 0.5, a.ToDoubles(), lda, b.ToDoubles(), ldb,
                  beta, c.ToDoubles(), n, &want, &scale);
          GemmBF16(ta, tb, m, n, k, 0.5f, a.data<BFloat16>(), lda,
                   b.data<BFloat16>(), ldb, beta, c.data<float>(), n);
          ExpectWithin(c.ToDoubles(), want, scale, F32Tol(k),
                       ::testing::PrintToString(std::make_tuple(
                           static_cast<int>(policy), ta, tb, beta)));
        }
      }
    }
  }
}

// Native bf16 GEMMs with many rows hand oneDNN a B packed once up front
// (for speed): every transpose, beta and output dtype must give the bytes
// the same call gives with B as it is, and stay within the reference bound.
// k is long, so the sums cross several of oneDNN's k blocks.
TEST(GemmTest, NativeBf16WithBPackedFirstGivesTheSameBytes) {
  if (!NativeBf16Available()) {
    std::printf("no native bf16 on this CPU: nothing to check\n");
    GTEST_SKIP() << "no native bf16 on this CPU";
  }
  ScopedBf16Policy scoped(Bf16PathPolicy::kNative);
  // Padded columns and k pairs (1100 -> 1120, 144 -> 192), then an odd k
  // (its last pair half padding) with whole 64-column blocks.
  for (auto [m, n, k] :
       {std::make_tuple(int64_t{160}, int64_t{144}, int64_t{1100}),
        std::make_tuple(int64_t{64}, int64_t{128}, int64_t{333})}) {
    uint32_t seed = 900;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          for (DType c_dtype : {DType::kFloat32, DType::kBFloat16}) {
            const std::string what = ::testing::PrintToString(
                std::make_tuple(m, n, k, ta, tb, beta, DTypeName(c_dtype)));
            Tensor a = RandomTensor(ta ? Shape{k, m} : Shape{m, k},
                                    DType::kBFloat16, ++seed);
            Tensor b = RandomTensor(tb ? Shape{n, k} : Shape{k, n},
                                    DType::kBFloat16, ++seed);
            Tensor c0 = RandomTensor({m, n}, c_dtype, ++seed);
            Tensor plain = c0.Clone();
            Tensor packed = c0.Clone();
            const int64_t saved = internal::SetBf16PackBMinRowsForTesting(
                std::numeric_limits<int64_t>::max());
            ASSERT_TRUE(Gemm(a, ta, b, tb, &plain, 0.5f, beta).ok()) << what;
            internal::SetBf16PackBMinRowsForTesting(1);
            ASSERT_TRUE(Gemm(a, ta, b, tb, &packed, 0.5f, beta).ok()) << what;
            internal::SetBf16PackBMinRowsForTesting(saved);
            EXPECT_EQ(Bytes(packed), Bytes(plain)) << what;
            if (c_dtype != DType::kFloat32) continue;
            std::vector<double> want, scale;
            RefGemm(ta, tb, m, n, k, 0.5, a.ToDoubles(), ta ? m : k,
                    b.ToDoubles(), tb ? k : n, beta, c0.ToDoubles(), n, &want,
                    &scale);
            ExpectWithin(packed.ToDoubles(), want, scale, F32Tol(k), what);
          }
        }
      }
    }
  }
}

// On the native path a bf16 c is written by oneDNN itself, without fp32
// staging. oneDNN may block its sums differently for a bf16 and an fp32
// output (an AMX kernel may), so the two fp32 accumulations can differ by the
// fp32 rounding error (far below half a bf16 ulp); the bf16 value, rounded
// once from such a sum, is then within one bf16 ulp (of the value's binade)
// of the fp32 result.
TEST(GemmTest, NativeBf16OutputIsTheFp32ResultRoundedOnce) {
  if (!NativeBf16Available()) {
    std::printf("no native bf16 on this CPU: nothing to check\n");
    GTEST_SKIP() << "no native bf16 on this CPU";
  }
  ScopedBf16Policy scoped(Bf16PathPolicy::kNative);
  const int64_t m = 37, n = 45, k = 96;
  Tensor a = RandomTensor({m, k}, DType::kBFloat16, 61);
  Tensor b = RandomTensor({n, k}, DType::kBFloat16, 62);
  Tensor c32 = Tensor::Zeros({m, n}, DType::kFloat32);
  Tensor c16 = Tensor::Zeros({m, n}, DType::kBFloat16);
  ASSERT_TRUE(Gemm(a, false, b, true, &c32, 0.75f).ok());
  ASSERT_TRUE(Gemm(a, false, b, true, &c16, 0.75f).ok());
  const std::vector<double> want = c32.ToDoubles(), got = c16.ToDoubles();
  for (size_t i = 0; i < want.size(); ++i) {
    int exponent = 0;
    std::frexp(want[i], &exponent);  // |want| in [2^(e-1), 2^e).
    const double ulp = std::ldexp(1.0, exponent - 8);
    EXPECT_LE(std::fabs(got[i] - want[i]), ulp)
        << "element " << i << ": bf16 " << got[i] << ", fp32 " << want[i];
  }
}

// The automatic choice measures both paths on the first GEMM of a shape
// class, into scratch: the call's own c (here accumulated with beta = 1) must
// come out exactly as one GEMM would leave it, and later calls of the shape
// reuse the recorded choice.
TEST(GemmTest, AutomaticBf16ChoiceIsMeasuredOnceAndLeavesCAlone) {
  ScopedBf16Policy scoped(Bf16PathPolicy::kAuto);
  const int64_t m = 128, n = 96, k = 256;  // 6.3 MFLOP: above the threshold.
  Tensor a = RandomTensor({m, k}, DType::kBFloat16, 41);
  Tensor b = RandomTensor({n, k}, DType::kBFloat16, 42);
  Tensor c = RandomTensor({m, n}, DType::kFloat32, 43);
  std::vector<double> want, scale;
  RefGemm(false, true, m, n, k, 1, a.ToDoubles(), k, b.ToDoubles(), k, 1,
          c.ToDoubles(), n, &want, &scale);
  ASSERT_TRUE(Gemm(a, false, b, true, &c, 1.0f, 1.0f).ok());
  ExpectWithin(c.ToDoubles(), want, scale, F32Tol(k), "first (measured) call");
  std::vector<Bf16GemmChoice> choices = Bf16GemmChoices();
  if (!NativeBf16Available()) {
    EXPECT_TRUE(choices.empty()) << "nothing to choose without native bf16";
    return;
  }
  ASSERT_EQ(choices.size(), 1u);
  const Bf16GemmChoice& ch = choices[0];
  EXPECT_TRUE(ch.measured);
  EXPECT_EQ(ch.shape.m, m);
  EXPECT_EQ(ch.shape.n, n);
  EXPECT_EQ(ch.shape.k, k);
  EXPECT_FALSE(ch.shape.trans_a);
  EXPECT_TRUE(ch.shape.trans_b);
  EXPECT_GT(ch.native_gflops, 0);
  EXPECT_GT(ch.widened_gflops, 0);
  // The rule: native only when at least 10% faster.
  EXPECT_EQ(ch.path, ch.native_gflops * 0.9 > ch.widened_gflops
                         ? GemmPath::kNativeBF16
                         : GemmPath::kConvertToF32)
      << FormatBf16GemmChoice(ch);
  std::printf("%s\n", FormatBf16GemmChoice(ch).c_str());
  // Same shape again: no new measurement.
  ASSERT_TRUE(Gemm(a, false, b, true, &c, 1.0f, 0.0f).ok());
  EXPECT_EQ(Bf16GemmChoices().size(), 1u);
  // Below the threshold: widened, not measured.
  Tensor small_a = RandomTensor({8, 16}, DType::kBFloat16, 44);
  Tensor small_b = RandomTensor({16, 8}, DType::kBFloat16, 45);
  Tensor small_c = Tensor::Zeros({8, 8}, DType::kFloat32);
  ASSERT_TRUE(Gemm(small_a, false, small_b, false, &small_c).ok());
  EXPECT_EQ(Bf16GemmChoices().size(), 1u);
}

TEST(GemmTest, BadInputsNameShapesAndLeaveOutputUntouched) {
  Tensor a = RandomTensor({4, 8}, DType::kFloat32, 1);
  Tensor b = RandomTensor({7, 3}, DType::kFloat32, 2);
  Tensor c = RandomTensor({4, 3}, DType::kFloat32, 3);
  const auto before = Bytes(c);
  absl::Status s = Gemm(a, false, b, false, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a fp32[4, 8] and b fp32[7, 3]"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("inner dimensions differ"), std::string::npos)
      << s;
  EXPECT_EQ(Bytes(c), before);

  Tensor b_ok = RandomTensor({8, 3}, DType::kFloat32, 4);
  Tensor c_bad = RandomTensor({4, 4}, DType::kFloat32, 5);
  const auto before_bad = Bytes(c_bad);
  s = Gemm(a, false, b_ok, false, &c_bad);
  EXPECT_NE(s.message().find("c fp32[4, 4] should be [4, 3]"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("b fp32[8, 3]"), std::string::npos) << s;
  EXPECT_EQ(Bytes(c_bad), before_bad);

  Tensor b16 = RandomTensor({8, 3}, DType::kBFloat16, 6);
  s = Gemm(a, false, b16, false, &c);
  EXPECT_NE(s.message().find("a fp32[4, 8] and b bf16[8, 3]"),
            std::string::npos)
      << s;
  EXPECT_EQ(Bytes(c), before);

  Tensor a3 = RandomTensor({2, 4, 8}, DType::kFloat32, 7);
  s = Gemm(a3, false, b_ok, false, &c);
  EXPECT_NE(s.message().find("a fp32[2, 4, 8] and b fp32[8, 3]"),
            std::string::npos)
      << s;
  Tensor b3 = RandomTensor({3, 8, 3}, DType::kFloat32, 8);
  Tensor c3 = RandomTensor({2, 4, 3}, DType::kFloat32, 9);
  const auto before3 = Bytes(c3);
  s = BatchedGemm(a3, false, b3, false, &c3);
  EXPECT_NE(s.message().find("batch sizes differ"), std::string::npos) << s;
  EXPECT_NE(s.message().find("b fp32[3, 8, 3]"), std::string::npos) << s;
  EXPECT_EQ(Bytes(c3), before3);

  Tensor ints = Tensor::Zeros({4, 3}, DType::kInt32);
  s = Gemm(a, false, b_ok, false, &ints);
  EXPECT_NE(s.message().find("int32[4, 3]"), std::string::npos) << s;
  s = Gemm(a, false, b_ok, false, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

// k == 0: the product is empty, so c = beta * c, and zeros that ignore NaNs
// in c for beta == 0 (the GEMM routines would reject a leading dimension
// of 0).
TEST(GemmTest, EmptyInnerDimensionGivesBetaTimesC) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor a = Tensor::Zeros({4, 0}, dt);
    const Tensor b = Tensor::Zeros({0, 6}, dt);
    Tensor c =
        Tensor::Full({4, 6}, std::numeric_limits<double>::quiet_NaN(), dt);
    ASSERT_TRUE(Gemm(a, false, b, false, &c).ok());
    for (double v : c.ToDoubles()) EXPECT_EQ(v, 0.0);
    c = Tensor::Full({4, 6}, 3.0, dt);
    ASSERT_TRUE(Gemm(Tensor::Zeros({0, 4}, dt), true, Tensor::Zeros({6, 0}, dt),
                     true, &c, 1.0f, 0.5f)
                    .ok());
    for (double v : c.ToDoubles()) EXPECT_EQ(v, 1.5);
    const Tensor a3 = Tensor::Zeros({2, 4, 0}, dt);
    Tensor c3 = Tensor::Full({2, 4, 6}, 2.0, dt);
    ASSERT_TRUE(BatchedGemm(a3, false, b, false, &c3, 1.0f, 2.0f).ok());
    for (double v : c3.ToDoubles()) EXPECT_EQ(v, 4.0);
  }
}

TEST(GemmTest, CudaTensorsNeedARegisteredKernel) {
  Tensor a = testing::FakeCudaTensor({4, 8}, DType::kFloat32);
  Tensor b = testing::FakeCudaTensor({8, 3}, DType::kFloat32);
  Tensor c = testing::FakeCudaTensor({4, 3}, DType::kFloat32);
  absl::Status s = Gemm(a, false, b, false, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("Gemm"), std::string::npos) << s;
  // Mixed devices are refused before dispatch.
  Tensor cpu_b = RandomTensor({8, 3}, DType::kFloat32, 1);
  s = Gemm(a, false, cpu_b, false, &c);
  EXPECT_NE(s.message().find("different devices"), std::string::npos) << s;
  // A registered kernel receives the validated call.
  static int calls = 0;
  GemmKernels().Register(
      DeviceType::kCUDA,
      [](const Tensor&, bool, const Tensor&, bool, Tensor*, float, float) {
        ++calls;
        return absl::OkStatus();
      });
  EXPECT_TRUE(Gemm(a, false, b, false, &c).ok());
  EXPECT_EQ(calls, 1);
  Tensor c_bad = testing::FakeCudaTensor({4, 4}, DType::kFloat32);
  EXPECT_FALSE(Gemm(a, false, b, false, &c_bad).ok());
  EXPECT_EQ(calls, 1);
  GemmKernels().Register(DeviceType::kCUDA, nullptr);
}

// Every path on the test device equals the CPU bit for bit (the CPU kernel
// runs on host views, through the slot).
TEST(GemmTestDevice, MatchesCpuBitForBit) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      Tensor a =
          testing::RandomTensor(ta ? Shape{24, 16} : Shape{16, 24}, dt, 1 + t);
      Tensor b =
          testing::RandomTensor(tb ? Shape{40, 24} : Shape{24, 40}, dt, 9 + t);
      Tensor c = testing::RandomTensor({16, 40}, DType::kFloat32, 20);
      testing::ExpectSameOnTestDevice({a, b, c}, [&](std::vector<Tensor>& x) {
        return Gemm(x[0], ta, x[1], tb, &x[2], 0.5f, 1.0f);
      });
      Tensor c16 = Tensor::Zeros({16, 40}, dt);
      testing::ExpectSameOnTestDevice({a, b, c16}, [&](std::vector<Tensor>& x) {
        return Gemm(x[0], ta, x[1], tb, &x[2]);
      });
    }
    Tensor a = testing::RandomTensor({3, 8, 12}, dt, 30);
    Tensor b = testing::RandomTensor({3, 12, 5}, dt, 31);
    Tensor c = Tensor::Zeros({3, 8, 5}, DType::kFloat32);
    testing::ExpectSameOnTestDevice({a, b, c}, [](std::vector<Tensor>& x) {
      return BatchedGemm(x[0], false, x[1], false, &x[2]);
    });
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
