// Bf16DotGemm against a float64 product of the same bf16 inputs. Products of
// bf16 values are exact in fp32, so the bound is fp32 accumulation alone:
// |C - C_ref| <= gamma(k + 1) * (sum_p |A(i, p) B(p, j)| + |C_old|), with
// gamma(n) = n u / (1 - n u), u = 2^-24.

#include "core/ops/bf16_dot_gemm.h"

#include <cmath>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/ops/cpu_isa.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

double Gamma(int64_t n) {
  const double u = std::ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

void Check(int64_t m, int64_t n, int64_t k, bool accumulate) {
  std::mt19937 rng(static_cast<uint32_t>(m * 1000 + n * 10 + k));
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const int64_t lda = k + 2, ldb = 2 * n + 4, ldc = n + 3;
  std::vector<BFloat16> a(m * lda), b((k / 2) * ldb);
  for (auto& x : a) x = FloatToBFloat16(dist(rng));
  for (auto& x : b) x = FloatToBFloat16(dist(rng));
  std::vector<float> c(m * ldc);
  for (auto& x : c) x = dist(rng);
  const std::vector<float> old = c;
  Bf16DotGemm(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, accumulate);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = accumulate ? old[i * ldc + j] : 0.0;
      double magnitude = std::fabs(want);
      for (int64_t p = 0; p < k; ++p) {
        const double prod =
            static_cast<double>(BFloat16ToFloat(a[i * lda + p])) *
            BFloat16ToFloat(b[(p / 2) * ldb + 2 * j + p % 2]);
        want += prod;
        magnitude += std::fabs(prod);
      }
      EXPECT_LE(std::fabs(c[i * ldc + j] - want), Gamma(k + 1) * magnitude)
          << "m " << m << " n " << n << " k " << k << " at " << i << ", " << j;
    }
    // Columns past n are not written.
    for (int64_t j = n; j < ldc; ++j) {
      EXPECT_EQ(c[i * ldc + j], old[i * ldc + j]) << "column " << j;
    }
  }
}

TEST(Bf16DotGemmTest, MatchesFloat64WithinAccumulationBound) {
  if (!CpuSupportsAvx512Bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (int64_t m : {1, 5, 12, 13, 64}) {
    for (int64_t n : {1, 16, 17, 32, 45, 64, 128}) {
      for (int64_t k : {2, 64, 128}) {
        Check(m, n, k, false);
        Check(m, n, k, true);
      }
    }
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
