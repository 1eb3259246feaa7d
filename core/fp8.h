#ifndef CORE_FP8_H_
#define CORE_FP8_H_

// The two 8-bit floating-point formats of the OCP FP8 specification (v1.0),
// as Hopper's tensor cores, cuBLASLt and TransformerEngine use them:
//
//   E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities; the
//         codes S.1111.111 are NaN, so the largest finite value is
//         S.1111.110 = 448. Smallest subnormal 2^-9, smallest normal 2^-6.
//   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like:
//         S.11111.00 is infinity, S.11111.{01,10,11} NaN, the largest finite
//         value S.11110.11 = 57344. Smallest subnormal 2^-16, normal 2^-14.
//
// Conversion from fp32 rounds to nearest, ties to even, and saturates (the
// specification's saturation mode, the one TransformerEngine casts with):
// a finite value beyond the largest finite one, or an infinity, becomes
// the largest finite value of its sign. NaN stays NaN. Conversion to fp32 is
// exact. Values are bit patterns in a uint8_t; tensors of them do not exist
// here: FP8 GEMMs (core/ops/fp8_gemm.h) take high-precision tensors and
// their scales, and round on the way in.

#include <cstdint>

namespace mcc {

enum class Fp8Format {
  kE4M3,
  kE5M2,
};

// "e4m3" or "e5m2".
const char* Fp8FormatName(Fp8Format format);

// The largest finite value: 448 (E4M3) or 57344 (E5M2).
float Fp8Max(Fp8Format format);

// fp32 -> FP8 code: round to nearest even, saturating (see above).
uint8_t FloatToFp8(float f, Fp8Format format);

// FP8 code -> fp32, exact (NaN codes give a quiet NaN; E5M2 infinities an
// infinity).
float Fp8ToFloat(uint8_t code, Fp8Format format);

// Fp8ToFloat(FloatToFp8(f)): the value f takes in FP8.
inline float RoundToFp8(float f, Fp8Format format) {
  return Fp8ToFloat(FloatToFp8(f, format), format);
}

}  // namespace mcc

#endif  // CORE_FP8_H_
