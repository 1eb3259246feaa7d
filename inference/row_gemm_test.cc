// RowGemm: against a double-precision reference, and row by row
// bit-identical whatever the number of rows around it.
#include "inference/row_gemm.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace inference {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(RowGemmTest, MatchesDoubleReference) {
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

TEST(RowGemmTest, EachRowIsBitIdenticalForAnyRowCount) {
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

}  // namespace
}  // namespace inference
}  // namespace mcc
