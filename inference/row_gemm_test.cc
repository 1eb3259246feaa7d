// RowGemm: against a double-precision reference, bit for bit against the
// scalar fma chain its contract names, and row by row bit-identical
// whatever the number of rows around it.
#include "inference/row_gemm.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/ops/cpu_isa.h"
#include "gtest/gtest.h"

namespace mcc {
namespace inference {
namespace {

// Every test runs on each kernel ISA this CPU has (AVX2; AVX-512 where
// supported), each its own fixed order.
class RowGemmIsaTest : public ::testing::TestWithParam<ops::CpuIsa> {
 protected:
  void SetUp() override {
    if (GetParam() == ops::CpuIsa::kAvx512 && !ops::CpuSupportsAvx512()) {
      GTEST_SKIP() << "this CPU has no AVX-512";
    }
    previous_ = ops::internal::SetKernelIsaForTesting(GetParam());
  }
  void TearDown() override { ops::internal::SetKernelIsaForTesting(previous_); }

 private:
  ops::CpuIsa previous_ = ops::CpuIsa::kAvx2;
};

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST_P(RowGemmIsaTest, MatchesDoubleReference) {
  for (int64_t k : {1, 7, 8, 64, 129}) {
    for (int64_t rows : {1, 3, 4, 9}) {
      const int64_t cols = 13;
      auto x = Random(rows * k, 1), w = Random(cols * k, 2);
      std::vector<float> y(rows * cols);
      RowGemm(x.data(), rows, k, w.data(), cols, y.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          double ref = 0, mag = 0;
          for (int64_t i = 0; i < k; ++i) {
            ref += static_cast<double>(x[r * k + i]) * w[c * k + i];
            mag += std::abs(static_cast<double>(x[r * k + i]) * w[c * k + i]);
          }
          // fp32 summation of k products: at most about k ulps of the
          // magnitude sum.
          EXPECT_NEAR(y[r * cols + c], ref, 1.2e-7 * k * mag + 1e-30)
              << "k " << k << " rows " << rows;
        }
      }
    }
  }
}

TEST_P(RowGemmIsaTest, EachRowIsBitIdenticalForAnyRowCount) {
  const int64_t k = 100, cols = 37;
  auto x = Random(33 * k, 3), w = Random(cols * k, 4);
  std::vector<float> all(33 * cols);
  RowGemm(x.data(), 33, k, w.data(), cols, all.data());
  for (int64_t rows : {1, 2, 5, 8}) {
    for (int64_t start = 0; start + rows <= 33; start += 7) {
      std::vector<float> part(rows * cols);
      RowGemm(x.data() + start * k, rows, k, w.data(), cols, part.data());
      EXPECT_EQ(std::memcmp(part.data(), all.data() + start * cols,
                            part.size() * sizeof(float)),
                0)
          << "rows " << rows << " from " << start;
    }
  }
}

std::vector<int8_t> RandomInt8(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int8_t> v(n);
  for (int8_t& q : v)
    q = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  return v;
}

// core/ops/int8_gemm.h's bound: with u = 2^-24 and g = k u / (1 - k u),
// |y - s sum x q| <= (g + u (1 + g)) s sum |x q|.
TEST_P(RowGemmIsaTest, Int8MatchesDoubleReferenceWithinTheInt8GemmBound) {
  for (int64_t k : {1, 7, 8, 64, 129}) {
    for (int64_t rows : {1, 3, 4, 9}) {
      const int64_t cols = 13;
      auto x = Random(rows * k, 5);
      auto q = RandomInt8(cols * k, 6);
      auto scales = Random(cols, 7);
      std::vector<float> y(rows * cols);
      RowGemmInt8(x.data(), rows, k, q.data(), scales.data(), cols, y.data());
      const double u = std::ldexp(1.0, -24);
      const double g = k * u / (1 - k * u);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          double ref = 0, mag = 0;
          for (int64_t i = 0; i < k; ++i) {
            const double p = static_cast<double>(x[r * k + i]) * q[c * k + i];
            ref += p;
            mag += std::abs(p);
          }
          const double s = scales[c];
          EXPECT_NEAR(y[r * cols + c], s * ref,
                      (g + u * (1 + g)) * std::abs(s) * mag + 1e-30)
              << "k " << k << " rows " << rows << " col " << c;
        }
      }
    }
  }
}

TEST_P(RowGemmIsaTest, Int8EachRowIsBitIdenticalForAnyRowCount) {
  const int64_t k = 100, cols = 37;
  auto x = Random(33 * k, 8);
  auto q = RandomInt8(cols * k, 9);
  auto scales = Random(cols, 10);
  std::vector<float> all(33 * cols);
  RowGemmInt8(x.data(), 33, k, q.data(), scales.data(), cols, all.data());
  for (int64_t rows : {1, 2, 5, 8}) {
    for (int64_t start = 0; start + rows <= 33; start += 7) {
      std::vector<float> part(rows * cols);
      RowGemmInt8(x.data() + start * k, rows, k, q.data(), scales.data(), cols,
                  part.data());
      EXPECT_EQ(std::memcmp(part.data(), all.data() + start * cols,
                            part.size() * sizeof(float)),
                0)
          << "rows " << rows << " from " << start;
    }
  }
}

// The int8 path computes what the fp32 path computes on the widened weights,
// scaled once: the same products summed in the same order.
TEST_P(RowGemmIsaTest, Int8EqualsRowGemmOnWidenedWeightsThenScaled) {
  const int64_t k = 77, cols = 11, rows = 5;
  auto x = Random(rows * k, 11);
  auto q = RandomInt8(cols * k, 12);
  auto scales = Random(cols, 13);
  std::vector<float> widened(q.begin(), q.end());
  std::vector<float> dense(rows * cols), int8(rows * cols);
  RowGemm(x.data(), rows, k, widened.data(), cols, dense.data());
  RowGemmInt8(x.data(), rows, k, q.data(), scales.data(), cols, int8.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_EQ(int8[r * cols + c], dense[r * cols + c] * scales[c]);
    }
  }
}

// FixedOrderDot is one output of RowGemm: the column blocks and the odd
// columns compute each output the same way.
TEST_P(RowGemmIsaTest, FixedOrderDotIsOneOutputOfRowGemm) {
  for (int64_t k : {5, 16, 33, 100}) {
    const int64_t cols = 9;
    auto x = Random(k, 14), w = Random(cols * k, 15);
    std::vector<float> y(cols);
    RowGemm(x.data(), 1, k, w.data(), cols, y.data());
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_EQ(y[c], FixedOrderDot(x.data(), w.data() + c * k, k))
          << "k " << k << " col " << c;
    }
  }
}

// The contract's order, written out: one fma chain over k from 0.
float ScalarChain(const float* x, const float* w, int64_t k) {
  float s = 0;
  for (int64_t i = 0; i < k; ++i) s = std::fma(x[i], w[i], s);
  return s;
}

// Every tile shape (rows 1..13 cover each row block of 1..6 and their
// splits; columns cover whole and partial panels and panel groups) gives
// the scalar chain's bits, so no tile or ISA can reorder a sum.
TEST_P(RowGemmIsaTest, EqualsTheScalarFmaChainBitForBit) {
  for (int64_t k : {1, 3, 16, 67}) {
    for (int64_t cols : {1, 15, 16, 17, 64, 65, 100}) {
      for (int64_t rows : {1, 2, 5, 6, 7, 12, 13}) {
        auto x = Random(rows * k, 20), w = Random(cols * k, 21);
        std::vector<float> y(rows * cols);
        RowGemm(x.data(), rows, k, w.data(), cols, y.data());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            ASSERT_EQ(y[r * cols + c],
                      ScalarChain(x.data() + r * k, w.data() + c * k, k))
                << "k " << k << " cols " << cols << " rows " << rows << " at "
                << r << "," << c;
          }
        }
      }
    }
  }
}

TEST_P(RowGemmIsaTest, Int8EqualsTheScalarFmaChainThenScaleBitForBit) {
  for (int64_t k : {1, 16, 67}) {
    for (int64_t cols : {1, 17, 64, 65}) {
      for (int64_t rows : {1, 6, 7, 13}) {
        auto x = Random(rows * k, 22);
        auto q = RandomInt8(cols * k, 23);
        auto scales = Random(cols, 24);
        std::vector<float> y(rows * cols);
        RowGemmInt8(x.data(), rows, k, q.data(), scales.data(), cols, y.data());
        for (int64_t c = 0; c < cols; ++c) {
          std::vector<float> widened(q.begin() + c * k,
                                     q.begin() + (c + 1) * k);
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_EQ(
                y[r * cols + c],
                ScalarChain(x.data() + r * k, widened.data(), k) * scales[c])
                << "k " << k << " cols " << cols << " rows " << rows;
          }
        }
      }
    }
  }
}

// Weights packed once serve any number of calls and rows, as packing per
// call does; a packed int8 matrix reports itself as such.
TEST_P(RowGemmIsaTest, PackedOnceEqualsPackedPerCall) {
  const int64_t k = 40, cols = 50, rows = 9;
  auto x = Random(rows * k, 25), w = Random(cols * k, 26);
  const RowGemmWeights packed = RowGemmWeights::Pack(w.data(), cols, k);
  EXPECT_FALSE(packed.is_int8());
  EXPECT_EQ(packed.cols(), cols);
  EXPECT_EQ(packed.panels(), 4);
  std::vector<float> a(rows * cols), b(rows * cols);
  RowGemm(x.data(), rows, packed, a.data());
  RowGemm(x.data(), rows, k, w.data(), cols, b.data());
  EXPECT_EQ(a, b);
  auto q = RandomInt8(cols * k, 27);
  auto scales = Random(cols, 28);
  const RowGemmWeights packed8 =
      RowGemmWeights::PackInt8(q.data(), scales.data(), cols, k);
  EXPECT_TRUE(packed8.is_int8());
  RowGemm(x.data(), rows, packed8, a.data());
  RowGemmInt8(x.data(), rows, k, q.data(), scales.data(), cols, b.data());
  EXPECT_EQ(a, b);
}

// UnpackRow gives back each row given to Pack (the engine's tied
// embeddings read their rows from the packed output layer).
TEST(RowGemmTest, UnpackRowGivesBackEachRow) {
  const int64_t k = 9, cols = 35;
  auto w = Random(cols * k, 31);
  const RowGemmWeights packed = RowGemmWeights::Pack(w.data(), cols, k);
  std::vector<float> row(k);
  for (int64_t c = 0; c < cols; ++c) {
    packed.UnpackRow(c, row.data());
    EXPECT_EQ(row,
              std::vector<float>(w.begin() + c * k, w.begin() + (c + 1) * k))
        << "row " << c;
  }
}

// The two kernel ISAs compute the same chain: the same bits on AVX2 and
// AVX-512 (where the CPU has it).
TEST(RowGemmTest, AvxTwoAndAvx512GiveTheSameBits) {
  if (!ops::CpuSupportsAvx512()) GTEST_SKIP() << "this CPU has no AVX-512";
  const int64_t k = 130, cols = 77, rows = 11;
  auto x = Random(rows * k, 29), w = Random(cols * k, 30);
  std::vector<float> y2(rows * cols), y512(rows * cols);
  const ops::CpuIsa previous =
      ops::internal::SetKernelIsaForTesting(ops::CpuIsa::kAvx2);
  RowGemm(x.data(), rows, k, w.data(), cols, y2.data());
  ops::internal::SetKernelIsaForTesting(ops::CpuIsa::kAvx512);
  RowGemm(x.data(), rows, k, w.data(), cols, y512.data());
  ops::internal::SetKernelIsaForTesting(previous);
  EXPECT_EQ(std::memcmp(y2.data(), y512.data(), y2.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Isas, RowGemmIsaTest,
                         ::testing::Values(ops::CpuIsa::kAvx2,
                                           ops::CpuIsa::kAvx512),
                         [](const auto& info) {
                           return info.param == ops::CpuIsa::kAvx512
                                      ? std::string("avx512")
                                      : std::string("avx2");
                         });

}  // namespace
}  // namespace inference
}  // namespace mcc
