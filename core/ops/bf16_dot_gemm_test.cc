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

// A(i, p) of the test's matrix, stored row-major (transposed_a false) or
// as the pair layout of A^T (word (p / 2) * ldp + i), as attention reads
// dO^T and Q^T.
void Check(int64_t m, int64_t n, int64_t k, bool accumulate,
           bool transposed_a) {
  std::mt19937 rng(static_cast<uint32_t>(m * 1000 + n * 10 + k));
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const int64_t lda = k + 2, ldp = m + 3, ldb = 2 * n + 4, ldc = n + 3;
  std::vector<BFloat16> a(transposed_a ? (k / 2) * 2 * ldp : m * lda);
  std::vector<BFloat16> b((k / 2) * ldb);
  for (auto& x : a) x = FloatToBFloat16(dist(rng));
  for (auto& x : b) x = FloatToBFloat16(dist(rng));
  auto at = [&](int64_t i, int64_t p) {
    return BFloat16ToFloat(transposed_a ? a[(p / 2) * 2 * ldp + 2 * i + p % 2]
                                        : a[i * lda + p]);
  };
  std::vector<float> c(m * ldc);
  for (auto& x : c) x = dist(rng);
  const std::vector<float> old = c;
  if (transposed_a) {
    Bf16DotGemm(m, n, k, a.data(), 1, ldp, b.data(), ldb, c.data(), ldc,
                accumulate);
  } else {
    Bf16DotGemm(m, n, k, a.data(), lda / 2, 1, b.data(), ldb, c.data(), ldc,
                accumulate);
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = accumulate ? old[i * ldc + j] : 0.0;
      double magnitude = std::fabs(want);
      for (int64_t p = 0; p < k; ++p) {
        const double prod = static_cast<double>(at(i, p)) *
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
        for (bool transposed_a : {false, true}) {
          Check(m, n, k, false, transposed_a);
          Check(m, n, k, true, transposed_a);
        }
      }
    }
  }
}

TEST(Bf16DotGemmTest, RoundingMatchesFloatToBFloat16WithZeroPadding) {
  if (!CpuSupportsAvx512Bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (int64_t rows : {1, 2, 7, 64}) {
    for (int64_t cols : {1, 15, 16, 33, 64}) {
      const int64_t lds = 70, ldd = 140;
      std::vector<float> src(rows * lds);
      for (auto& x : src) x = dist(rng);
      const BFloat16 junk = FloatToBFloat16(99.0f);
      std::vector<BFloat16> row_major(rows * ldd, junk);
      std::vector<BFloat16> pairs(((rows + 1) / 2) * ldd, junk);
      RoundToBf16Rows(src.data(), lds, rows, cols, row_major.data(), ldd);
      RoundToBf16Pairs(src.data(), lds, rows, cols, pairs.data(), ldd);
      for (int64_t r = 0; r < (rows + 1) / 2 * 2; ++r) {
        for (int64_t c = 0; c < (cols + 1) / 2 * 2; ++c) {
          const bool inside = r < rows && c < cols;
          const uint16_t want =
              inside ? FloatToBFloat16(src[r * lds + c]).bits : 0;
          if (r < rows) {
            EXPECT_EQ(row_major[r * ldd + c].bits, want)
                << "rows: " << r << ", " << c;
          }
          if (c < cols) {
            EXPECT_EQ(pairs[(r / 2) * ldd + 2 * c + r % 2].bits, want)
                << "pairs: " << r << ", " << c;
          }
        }
      }
    }
  }
}

TEST(Bf16DotGemmTest, RowPairsInterleaveTwoRowsWithZeroPadding) {
  if (!CpuSupportsAvx512Bf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (int64_t rows : {1, 2, 5, 64}) {
    for (int64_t d : {2, 16, 24, 64}) {
      const int64_t stride = d + 6;
      std::vector<BFloat16> src(rows * stride);
      for (size_t i = 0; i < src.size(); ++i) {
        src[i].bits = static_cast<uint16_t>(i * 7 + 1);
      }
      std::vector<BFloat16> dst((rows + 1) / 2 * 2 * d, BFloat16{0xffff});
      PackBf16RowPairs(src.data(), stride, rows, d, dst.data());
      for (int64_t t = 0; t < (rows + 1) / 2 * 2; ++t) {
        for (int64_t x = 0; x < d; ++x) {
          const uint16_t want = t < rows ? src[t * stride + x].bits : 0;
          EXPECT_EQ(dst[(t / 2) * 2 * d + 2 * x + t % 2].bits, want)
              << rows << " rows, d " << d << " at " << t << ", " << x;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
