#ifndef CORE_HALF_H_
#define CORE_HALF_H_

#include <cstdint>
#include <cstring>

namespace mcc {

// 16-bit floating-point storage types. Arithmetic happens in fp32; these only
// convert, with round-to-nearest-even, and keep NaN a NaN.
struct BFloat16 {
  uint16_t bits = 0;
};

struct Float16 {
  uint16_t bits = 0;
};

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline BFloat16 FloatToBFloat16(float f) {
  uint32_t u = FloatBits(f);
  BFloat16 out;
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and a NaN.
    out.bits = static_cast<uint16_t>((u >> 16) | 0x0040u);
    return out;
  }
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  out.bits = static_cast<uint16_t>((u + rounding_bias) >> 16);
  return out;
}

inline float BFloat16ToFloat(BFloat16 b) {
  return BitsToFloat(static_cast<uint32_t>(b.bits) << 16);
}

// IEEE binary16 conversion, round-to-nearest-even, subnormals included.
inline Float16 FloatToFloat16(float f) {
  uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  Float16 out;
  if (x > 0x7f800000u) {  // NaN
    out.bits = static_cast<uint16_t>(sign | 0x7e00u);
    return out;
  }
  if (x >= 0x477ff000u) {  // Rounds to or beyond 65520: infinity.
    out.bits = static_cast<uint16_t>(sign | 0x7c00u);
    return out;
  }
  if (x < 0x38800000u) {  // Below the smallest normal half: subnormal or 0.
    // Adding 0.5 shifts the value so the FPU's own rounding (to nearest
    // even) leaves the subnormal half's bits in the low mantissa.
    const float shifted = BitsToFloat(x) + 0.5f;
    out.bits = static_cast<uint16_t>(sign | (FloatBits(shifted) - 0x3f000000u));
    return out;
  }
  const uint32_t mant_odd = (x >> 13) & 1u;
  x += 0xc8000fffu + mant_odd;  // Rebias exponent (-112 << 23) and round.
  out.bits = static_cast<uint16_t>(sign | (x >> 13));
  return out;
}

inline float Float16ToFloat(Float16 h) {
  const uint32_t sign = (static_cast<uint32_t>(h.bits) & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1fu) {
    return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  }
  if (exp == 0) {
    // Subnormal: value = mant * 2^-24.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace mcc

#endif  // CORE_HALF_H_
