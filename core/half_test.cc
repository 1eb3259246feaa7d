#include "core/half.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace mcc {
namespace {

// Reference: the representable neighbours of f in a format with `mant_bits`
// of mantissa, chosen by round-to-nearest-even in double precision.
double RoundToBits(double f, int mant_bits, int min_exp) {
  if (f == 0) return f;
  int e;
  std::frexp(f, &e);  // f = m * 2^e, 0.5 <= |m| < 1
  e = std::max(e - 1, min_exp);
  const double ulp = std::ldexp(1.0, e - mant_bits);
  return std::nearbyint(f / ulp) * ulp;  // default rounding: to nearest even
}

TEST(HalfTest, BFloat16RoundsToNearestEven) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
  for (int i = 0; i < 100000; ++i) {
    const float f = dist(rng);
    const double expected = RoundToBits(f, 7, -126);
    EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(f)), static_cast<float>(expected))
        << f;
  }
  // Exactly halfway: 1 + 2^-8 lies between 1 and 1 + 2^-7; even is 1.
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8))),
            1.0f);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(
      FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(BFloat16ToFloat(FloatToBFloat16(INFINITY))));
}

TEST(HalfTest, Float16RoundsToNearestEvenWithSubnormals) {
  std::mt19937 rng(2);
  for (float scale : {1e-6f, 1e-3f, 1.0f, 1e3f, 6e4f}) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    for (int i = 0; i < 20000; ++i) {
      const float f = dist(rng);
      const double expected = RoundToBits(f, 10, -14);
      EXPECT_EQ(Float16ToFloat(FloatToFloat16(f)), static_cast<float>(expected))
          << f;
    }
  }
  EXPECT_EQ(Float16ToFloat(FloatToFloat16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(Float16ToFloat(FloatToFloat16(65520.0f))));
  EXPECT_EQ(Float16ToFloat(FloatToFloat16(65519.0f)), 65504.0f);
  EXPECT_TRUE(std::isnan(
      Float16ToFloat(FloatToFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Float16ToFloat(FloatToFloat16(std::ldexp(1.0f, -24))),
            std::ldexp(1.0f, -24));
}

TEST(HalfTest, EveryFloat16RoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    Float16 h{static_cast<uint16_t>(bits)};
    const float f = Float16ToFloat(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToFloat16(f).bits, h.bits) << bits;
  }
}

}  // namespace
}  // namespace mcc
