#include "core/fp8.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace {

// An independent float64 reference: the format's finite non-negative values
// enumerated from its definition, and round-to-nearest-even by search.
struct RefFormat {
  int exponent_bits, mantissa_bits, bias;
  bool ieee_specials;  // E5M2: top exponent is inf/NaN. E4M3: only S.1111.111
                       // is NaN.
};

constexpr RefFormat kRefE4M3{4, 3, 7, false};
constexpr RefFormat kRefE5M2{5, 2, 15, true};

const RefFormat& Ref(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? kRefE4M3 : kRefE5M2;
}

struct RefValue {
  double value;
  int code;
};

// Non-negative finite values in increasing order, with their codes.
std::vector<RefValue> FiniteValues(const RefFormat& f) {
  std::vector<RefValue> out;
  const int max_e = (1 << f.exponent_bits) - 1;
  for (int e = 0; e <= max_e; ++e) {
    for (int m = 0; m < (1 << f.mantissa_bits); ++m) {
      const int code = (e << f.mantissa_bits) | m;
      if (f.ieee_specials && e == max_e) continue;
      if (!f.ieee_specials && code == 0x7f) continue;
      const double frac = m / static_cast<double>(1 << f.mantissa_bits);
      const double v = e == 0 ? std::pow(2.0, 1 - f.bias) * frac
                              : std::pow(2.0, e - f.bias) * (1.0 + frac);
      out.push_back({v, code});
    }
  }
  return out;
}

// The reference code of x: saturating round to nearest, ties to the even
// code (mantissa's last bit 0).
int RefEncode(double x, Fp8Format format) {
  const std::vector<RefValue> values = FiniteValues(Ref(format));
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  if (a >= values.back().value) return sign | values.back().code;
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const RefValue& lo = values[i];
    const RefValue& hi = values[i + 1];
    if (a < lo.value || a > hi.value) continue;
    const double dlo = a - lo.value, dhi = hi.value - a;
    if (dlo < dhi) return sign | lo.code;
    if (dhi < dlo) return sign | hi.code;
    return sign | ((lo.code & 1) == 0 ? lo.code : hi.code);
  }
  ADD_FAILURE() << "no bracket for " << x;
  return -1;
}

bool IsNanCode(int code, Fp8Format format) {
  const int mag = code & 0x7f;
  return format == Fp8Format::kE4M3 ? mag == 0x7f : mag > 0x7c;
}

class Fp8Test : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(Fp8Test, EveryCodeDecodesToTheReferenceValue) {
  const Fp8Format format = GetParam();
  const std::vector<RefValue> values = FiniteValues(Ref(format));
  std::vector<double> expected(256, std::nan(""));
  for (const RefValue& v : values) {
    expected[v.code] = v.value;
    expected[v.code | 0x80] = -v.value;
  }
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float got = Fp8ToFloat(static_cast<uint8_t>(c), format);
    if (IsNanCode(c, format)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      ++nans;
    } else if (format == Fp8Format::kE5M2 && (c & 0x7f) == 0x7c) {
      EXPECT_EQ(got, (c & 0x80) ? -INFINITY : INFINITY) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected[c]) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
    }
  }
  EXPECT_EQ(nans, format == Fp8Format::kE4M3 ? 2 : 6);
}

TEST_P(Fp8Test, EveryCodeRoundTrips) {
  const Fp8Format format = GetParam();
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const uint8_t again = FloatToFp8(Fp8ToFloat(code, format), format);
    if (IsNanCode(c, format)) {
      EXPECT_TRUE(IsNanCode(again, format)) << c;
      EXPECT_EQ(again & 0x80, c & 0x80) << c;
    } else if (format == Fp8Format::kE5M2 && (c & 0x7f) == 0x7c) {
      EXPECT_EQ(again, (c & 0x80) | 0x7b) << "infinity saturates";
    } else {
      EXPECT_EQ(again, code) << c;
    }
  }
}

TEST_P(Fp8Test, MaxAndLimits) {
  const Fp8Format format = GetParam();
  const double max = FiniteValues(Ref(format)).back().value;
  EXPECT_EQ(Fp8Max(format), max);
  EXPECT_EQ(max, format == Fp8Format::kE4M3 ? 448.0 : 57344.0);
  EXPECT_EQ(Fp8ToFloat(1, format),
            std::ldexp(1.0, format == Fp8Format::kE4M3 ? -9 : -16));
}

// Each midpoint of two neighbouring values ties to the even code, and the
// floats just either side of it round to the nearer neighbour.
TEST_P(Fp8Test, RoundingBoundariesBetweenEveryPairOfNeighbours) {
  const Fp8Format format = GetParam();
  const std::vector<RefValue> values = FiniteValues(Ref(format));
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const RefValue& lo = values[i];
    const RefValue& hi = values[i + 1];
    const float mid = static_cast<float>((lo.value + hi.value) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo.value + hi.value) / 2);
    const int even = (lo.code & 1) == 0 ? lo.code : hi.code;
    for (const float sign : {1.0f, -1.0f}) {
      const int s = sign < 0 ? 0x80 : 0;
      EXPECT_EQ(FloatToFp8(sign * mid, format), s | even) << mid;
      EXPECT_EQ(FloatToFp8(sign * std::nextafter(mid, 0.0f), format),
                s | lo.code)
          << mid;
      EXPECT_EQ(FloatToFp8(sign * std::nextafter(mid, INFINITY), format),
                s | hi.code)
          << mid;
    }
  }
}

TEST_P(Fp8Test, SaturatesBeyondTheLargestValueAndKeepsNan) {
  const Fp8Format format = GetParam();
  const float max = Fp8Max(format);
  const uint8_t max_code = FloatToFp8(max, format);
  EXPECT_EQ(Fp8ToFloat(max_code, format), max);
  for (const float big :
       {std::nextafter(max, INFINITY), max * 1.0625f, max * 1.125f, max * 2.0f,
        std::numeric_limits<float>::max(), INFINITY}) {
    EXPECT_EQ(FloatToFp8(big, format), max_code) << big;
    EXPECT_EQ(FloatToFp8(-big, format), max_code | 0x80) << big;
  }
  EXPECT_TRUE(
      std::isnan(RoundToFp8(std::numeric_limits<float>::quiet_NaN(), format)));
  EXPECT_TRUE(
      std::isnan(RoundToFp8(-std::numeric_limits<float>::quiet_NaN(), format)));
  // The smallest subnormal's half ties to zero (even); a little more is it.
  const float tiny = Fp8ToFloat(1, format);
  EXPECT_EQ(FloatToFp8(tiny / 2, format), 0);
  EXPECT_EQ(FloatToFp8(std::nextafter(tiny / 2, 1.0f), format), 1);
  EXPECT_EQ(FloatToFp8(-tiny / 4, format), 0x80);
  EXPECT_EQ(FloatToFp8(1.5f * tiny, format), 2);  // Tie to even: 2.
  EXPECT_EQ(FloatToFp8(std::numeric_limits<float>::denorm_min(), format), 0);
}

TEST_P(Fp8Test, RandomValuesMatchTheReference) {
  const Fp8Format format = GetParam();
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> log2_mag(-20.0, 18.0);
  for (int i = 0; i < 20000; ++i) {
    float x = static_cast<float>(std::exp2(log2_mag(rng)));
    if (i % 2) x = -x;
    ASSERT_EQ(FloatToFp8(x, format), RefEncode(x, format)) << x;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Test,
                         ::testing::Values(Fp8Format::kE4M3, Fp8Format::kE5M2),
                         [](const ::testing::TestParamInfo<Fp8Format>& info) {
                           return std::string(Fp8FormatName(info.param));
                         });

TEST(Fp8NamesTest, Names) {
  EXPECT_STREQ(Fp8FormatName(Fp8Format::kE4M3), "e4m3");
  EXPECT_STREQ(Fp8FormatName(Fp8Format::kE5M2), "e5m2");
}

}  // namespace
}  // namespace mcc
