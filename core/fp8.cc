#include "core/fp8.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace mcc {
namespace {

struct FormatBits {
  int mantissa_bits;  // Stored mantissa bits (3 or 2).
  int bias;           // Exponent bias (7 or 15).
  uint8_t max_code;   // Largest finite magnitude's code.
  uint8_t nan_code;   // The NaN produced for a NaN input.
  float max_value;
};

constexpr FormatBits kE4M3Bits{3, 7, 0x7e, 0x7f, 448.0f};
constexpr FormatBits kE5M2Bits{2, 15, 0x7b, 0x7e, 57344.0f};

const FormatBits& Bits(Fp8Format format) {
  return format == Fp8Format::kE4M3 ? kE4M3Bits : kE5M2Bits;
}

uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Decodes a code from its fields (the tables below are built with it).
float Decode(uint8_t code, const FormatBits& b, bool has_infinity) {
  const bool negative = (code & 0x80) != 0;
  const int exp_field = (code & 0x7f) >> b.mantissa_bits;
  const int mantissa = code & ((1 << b.mantissa_bits) - 1);
  const int max_exp_field = (1 << (7 - b.mantissa_bits)) - 1;
  float magnitude;
  if (has_infinity && exp_field == max_exp_field) {
    magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
  } else if (!has_infinity && (code & 0x7f) == 0x7f) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exp_field == 0) {
    magnitude =
        std::ldexp(static_cast<float>(mantissa), 1 - b.bias - b.mantissa_bits);
  } else {
    magnitude = std::ldexp(
        1.0f + std::ldexp(static_cast<float>(mantissa), -b.mantissa_bits),
        exp_field - b.bias);
  }
  return negative ? -magnitude : magnitude;
}

using Table = std::array<float, 256>;

Table MakeTable(Fp8Format format) {
  Table t;
  for (int c = 0; c < 256; ++c) {
    t[c] = Decode(static_cast<uint8_t>(c), Bits(format),
                  format == Fp8Format::kE5M2);
  }
  return t;
}

}  // namespace

const char* Fp8FormatName(Fp8Format format) {
  return format == Fp8Format::kE4M3 ? "e4m3" : "e5m2";
}

float Fp8Max(Fp8Format format) { return Bits(format).max_value; }

uint8_t FloatToFp8(float f, Fp8Format format) {
  const FormatBits& b = Bits(format);
  const uint32_t u = ToBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t abs_bits = u & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | b.nan_code;
  const float a = FromBits(abs_bits);
  // Everything at or beyond the largest finite value (infinity included)
  // saturates; below it, rounding can reach the largest value but not pass.
  if (a >= b.max_value) return sign | b.max_code;
  const int min_normal_exp = 1 - b.bias;
  if (a < std::ldexp(1.0f, min_normal_exp)) {
    // Subnormal (or zero): the code is the value in units of the smallest
    // subnormal, rounded to nearest even (the default FP rounding mode).
    // Scaling by a power of two is exact; a result of 2^mantissa_bits is
    // the smallest normal's code, so the carry needs no special case.
    const float units =
        std::nearbyint(std::ldexp(a, b.mantissa_bits - min_normal_exp));
    return sign | static_cast<uint8_t>(units);
  }
  // Normal: round fp32's 23-bit mantissa to mantissa_bits, ties to even (a
  // carry into the exponent is the correct result), then rebias.
  const int drop = 23 - b.mantissa_bits;
  const uint32_t odd = (abs_bits >> drop) & 1u;
  const uint32_t rounded = (abs_bits + ((1u << (drop - 1)) - 1u) + odd) >> drop;
  const uint32_t rebias = static_cast<uint32_t>(127 - b.bias)
                          << b.mantissa_bits;
  return sign | static_cast<uint8_t>(rounded - rebias);
}

float Fp8ToFloat(uint8_t code, Fp8Format format) {
  static const Table* const e4m3 = new Table(MakeTable(Fp8Format::kE4M3));
  static const Table* const e5m2 = new Table(MakeTable(Fp8Format::kE5M2));
  return (format == Fp8Format::kE4M3 ? *e4m3 : *e5m2)[code];
}

}  // namespace mcc
