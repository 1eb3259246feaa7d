#include "core/checked_math.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace mcc {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(CheckedMathTest, MulAndAdd) {
  EXPECT_EQ(CheckedMul(6, 7), 42);
  EXPECT_EQ(CheckedMul(0, kMax), 0);
  EXPECT_EQ(CheckedMul(kMax, 1), kMax);
  EXPECT_FALSE(CheckedMul(int64_t{1} << 32, int64_t{1} << 31).has_value());
  EXPECT_FALSE(CheckedMul(-1, 2).has_value());
  EXPECT_EQ(CheckedAdd(kMax - 1, 1), kMax);
  EXPECT_FALSE(CheckedAdd(kMax, 1).has_value());
  EXPECT_FALSE(CheckedAdd(-1, 1).has_value());
}

TEST(CheckedMathTest, NumBytes) {
  EXPECT_EQ(CheckedNumBytes({2, 3}, 4), 24);
  EXPECT_EQ(CheckedNumBytes({}, 8), 8);
  EXPECT_EQ(CheckedNumBytes({0, kMax}, 4), 0);
  // 2^32 x 2^32 elements: wraps to 0 with plain multiplication.
  EXPECT_FALSE(
      CheckedNumBytes({int64_t{1} << 32, int64_t{1} << 32}, 4).has_value());
  EXPECT_FALSE(CheckedNumBytes({int64_t{1} << 62}, 4).has_value());
  EXPECT_FALSE(CheckedNumBytes({3, -1}, 4).has_value());
}

}  // namespace
}  // namespace mcc
