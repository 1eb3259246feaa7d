#include "core/ops/kernel_util.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/half.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

// The vectorised (F16C) conversions agree bit for bit with core/half.h's
// scalar ones, which the tails use, so a value's rounding never depends on
// its position in a block.
TEST(KernelUtilTest, F16ToF32MatchesScalarForEveryHalf) {
  std::vector<Float16> h(65536 + 5);  // Odd length: vector body and tail.
  for (size_t i = 0; i < h.size(); ++i) h[i].bits = static_cast<uint16_t>(i);
  std::vector<float> f(h.size());
  F16ToF32(h.data(), f.data(), static_cast<int64_t>(h.size()));
  for (size_t i = 0; i < h.size(); ++i) {
    const float want = Float16ToFloat(h[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f[i])) << i;
    } else {
      EXPECT_EQ(FloatBits(f[i]), FloatBits(want)) << i;
    }
  }
}

TEST(KernelUtilTest, F32ToF16RoundsToNearestEvenAsScalar) {
  std::vector<float> f = {0.0f,
                          -0.0f,
                          1.0f,
                          65504.0f,  // Largest half.
                          65519.0f,  // Rounds down to 65504.
                          65520.0f,  // Rounds to infinity.
                          1e6f,      // Overflow: infinity.
                          -1e6f,
                          std::numeric_limits<float>::infinity(),
                          6.1035156e-5f,       // Smallest normal half.
                          3.0e-5f,             // Subnormal half.
                          5.9604645e-8f,       // Smallest subnormal half.
                          2.9802322e-8f,       // Half of it: ties to even (0).
                          1e-9f,               // Underflow to zero.
                          1.0f + 1.0f / 2048,  // Tie: to even (1.0).
                          1.0f + 3.0f / 2048,  // Tie: to even (1 + 2^-9).
                          std::numeric_limits<float>::quiet_NaN()};
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-30, 20);
  for (int i = 0; i < 10000; ++i) {
    f.push_back(std::ldexp(mant(gen), ex(gen)));
  }
  std::vector<Float16> h(f.size());
  F32ToF16(f.data(), h.data(), static_cast<int64_t>(f.size()));
  for (size_t i = 0; i < f.size(); ++i) {
    const Float16 want = FloatToFloat16(f[i]);
    if (std::isnan(f[i])) {
      EXPECT_TRUE(std::isnan(Float16ToFloat(h[i]))) << i;
    } else {
      EXPECT_EQ(h[i].bits, want.bits) << i << " " << f[i];
    }
  }
  EXPECT_EQ(Float16ToFloat(h[4]), 65504.0f);
  EXPECT_TRUE(std::isinf(Float16ToFloat(h[5])));
  EXPECT_EQ(Float16ToFloat(h[14]), 1.0f);
}

TEST(KernelUtilTest, DispatchFloatAndCheckFloatDTypeCoverFp16) {
  int which = -1;
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    DispatchFloat(d, [&](auto tag) {
      using T = decltype(tag);
      which = std::is_same<T, float>::value      ? 0
              : std::is_same<T, BFloat16>::value ? 1
                                                 : 2;
    });
    EXPECT_EQ(which, d == DType::kFloat32 ? 0 : d == DType::kBFloat16 ? 1 : 2);
    Tensor t = Tensor::Zeros({2}, d);
    EXPECT_TRUE(CheckFloatDType("Op", {"x", &t}).ok());
  }
  Tensor i = Tensor::Zeros({2}, DType::kInt32);
  const absl::Status s = CheckFloatDType("Op", {"x", &i});
  EXPECT_NE(s.message().find("must be fp32, bf16 or fp16"), std::string::npos)
      << s;
  Tensor a = Tensor::Zeros({2}, DType::kBFloat16);
  Tensor b = Tensor::Zeros({2}, DType::kFloat16);
  EXPECT_FALSE(CheckOne16BitType("Op", {{"a", &a}, {"b", &b}}).ok());
  EXPECT_TRUE(CheckOne16BitType("Op", {{"a", &a}, {"i", &i}}).ok());
}

TEST(KernelUtilTest, LoadF32AnyReadsFp16) {
  std::vector<float> v = {1.5f, -2.25f, 1024.0f, 0.0f, 3.0e-5f};
  Tensor t = Tensor::FromVector(v, {5}, DType::kFloat16).value();
  std::vector<float> out(5);
  LoadF32Any(t, out.data());
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(out[i], Float16ToFloat(FloatToFloat16(v[i]))) << i;
  }
}

#if defined(__AVX2__)
// The in-register conversions of the fused loops (Store8 / Load8) round
// exactly as the scalar ones, infinities included (fp16 NaN stays NaN).
TEST(KernelUtilTest, Store8AndLoad8MatchScalarConversions) {
  std::mt19937 rng(7);
  std::vector<float> f(4096);
  for (float& v : f) {
    uint32_t u = static_cast<uint32_t>(rng());
    std::memcpy(&v, &u, sizeof(v));  // Any bit pattern: NaN, inf, subnormal.
  }
  f[0] = std::numeric_limits<float>::infinity();
  f[1] = -std::numeric_limits<float>::quiet_NaN();
  f[2] = 65520.0f;
  for (size_t i = 0; i < f.size(); i += 8) {
    const __m256 v = _mm256_loadu_ps(f.data() + i);
    BFloat16 b[8];
    Float16 h[8];
    Store8(b, v);
    Store8(h, v);
    alignas(32) float back_b[8], back_h[8];
    _mm256_store_ps(back_b, Load8(b));
    _mm256_store_ps(back_h, Load8(h));
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(b[j].bits, FloatToBFloat16(f[i + j]).bits) << f[i + j];
      if (std::isnan(f[i + j])) {  // F16C keeps NaN payloads; still NaN.
        EXPECT_TRUE(std::isnan(Float16ToFloat(h[j])));
      } else {
        EXPECT_EQ(h[j].bits, FloatToFloat16(f[i + j]).bits) << f[i + j];
      }
      EXPECT_EQ(FloatBits(back_b[j]), FloatBits(BFloat16ToFloat(b[j])));
      if (!std::isnan(back_h[j])) {
        EXPECT_EQ(FloatBits(back_h[j]), FloatBits(Float16ToFloat(h[j])));
      }
    }
  }
}

// The scalar exp equals the vector one lane for lane, so a scalar tail never
// differs from a vector body; both stay within 2 ulp of exp. The inputs
// include x with x log2(e) within a few ulp of a half-integer, where
// rounding x log2(e) once or not (an FMA contraction) picks another integer.
TEST(KernelUtilTest, VecExpIsExp8LaneForLaneAndWithin2Ulp) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.0137f) x.push_back(v);
  for (int k = -125; k <= 126; ++k) {
    float v = static_cast<float>((k + 0.5) / 1.4426950408889634);
    for (int j = 0; j < 4; ++j) v = std::nextafter(v, -100.0f);
    for (int j = 0; j < 9; ++j, v = std::nextafter(v, 100.0f)) x.push_back(v);
  }
  x.resize((x.size() + 7) / 8 * 8, 0.0f);
  for (size_t i = 0; i < x.size(); i += 8) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, Exp8(_mm256_loadu_ps(&x[i])));
    for (int j = 0; j < 8; ++j) {
      const float v = x[i + j];
      const float got = VecExp(v);
      EXPECT_EQ(FloatBits(got), FloatBits(lanes[j])) << v;
      if (v < -87.0f || v > 88.0f) continue;  // clamped
      const double want = std::exp(static_cast<double>(v));
      const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
      EXPECT_LE(std::fabs(got - want), 2 * ulp) << v;
    }
  }
}

// Load16 / Store16: every dtype puts element e in the same lane for a given
// order (so ops can mix fp32, bf16 and fp16 operands), a store undoes its
// load bit for bit, and the bf16 rounding is the scalar one.
// In order L, Store16 undoes Load16 bit for bit, and a tail of 5 elements
// leaves the rest of the destination (filled with `filler`) alone.
template <Lanes16 L, typename T>
void ExpectStoreUndoesLoad(const std::vector<T>& src,
                           const std::vector<float>& f, T filler) {
  __m256 lo, hi;
  std::vector<T> dst(16);
  Load16<L>(src.data(), &lo, &hi);
  Store16<L>(dst.data(), lo, hi);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), sizeof(T) * 16), 0);
  std::vector<T> tail(16, filler);
  LoadUpTo16<L>(src.data(), 5, &lo, &hi);
  StoreUpTo16<L>(tail.data(), lo, hi, 5);
  for (int e = 0; e < 16; ++e) {
    EXPECT_EQ(ToF32(tail[e]), e < 5 ? f[e] : ToF32(filler)) << e;
  }
}

template <typename T>
void ExpectLanes16RoundTrip(T (*from_float)(float)) {
  std::vector<float> f(16);
  for (int e = 0; e < 16; ++e) f[e] = 1.0f + e;  // exact in every dtype
  std::vector<T> src(16);
  for (int e = 0; e < 16; ++e) src[e] = from_float(f[e]);
  const int unpacked[16] = {0, 1, 2, 3, 8,  9,  10, 11,
                            4, 5, 6, 7, 12, 13, 14, 15};
  __m256 lo, hi;
  alignas(32) float lanes[16];
  Load16<Lanes16::kUnpacked>(src.data(), &lo, &hi);
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  for (int k = 0; k < 16; ++k) EXPECT_EQ(lanes[k], f[unpacked[k]]) << k;
  Load16<Lanes16::kNatural>(src.data(), &lo, &hi);
  _mm256_store_ps(lanes, lo);
  _mm256_store_ps(lanes + 8, hi);
  for (int k = 0; k < 16; ++k) EXPECT_EQ(lanes[k], f[k]) << k;
  ExpectStoreUndoesLoad<Lanes16::kNatural>(src, f, from_float(-7.0f));
  ExpectStoreUndoesLoad<Lanes16::kUnpacked>(src, f, from_float(-7.0f));
}

TEST(KernelUtilTest, Load16AndStore16AgreeOnLanesAcrossDTypes) {
  ExpectLanes16RoundTrip<float>([](float v) { return v; });
  ExpectLanes16RoundTrip<BFloat16>(FloatToBFloat16);
  ExpectLanes16RoundTrip<Float16>(FloatToFloat16);
}

TEST(KernelUtilTest, Store16RoundsBf16AsScalar) {
  std::mt19937 rng(11);
  std::vector<float> f(4096);
  for (float& v : f) {
    uint32_t u = static_cast<uint32_t>(rng());
    std::memcpy(&v, &u, sizeof(v));
  }
  for (size_t i = 0; i < f.size(); i += 16) {
    __m256 lo, hi;
    Load16<Lanes16::kUnpacked>(f.data() + i, &lo, &hi);
    BFloat16 b[16];
    Store16<Lanes16::kUnpacked>(b, lo, hi);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(b[j].bits, FloatToBFloat16(f[i + j]).bits) << f[i + j];
    }
  }
}

// ShuffleLanes16's layout is what two plain loads need to match
// Load16<kUnpacked>, and shuffling twice restores the row.
TEST(KernelUtilTest, ShuffleLanes16MatchesUnpackedLoads) {
  std::vector<float> row(37);
  for (size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>(i);
  std::vector<float> shuffled = row;
  ShuffleLanes16(shuffled.data(), 37);
  for (int64_t c = 0; c + 16 <= 37; c += 16) {
    __m256 a, b, lo, hi;
    Load16<Lanes16::kNatural>(shuffled.data() + c, &a, &b);
    Load16<Lanes16::kUnpacked>(row.data() + c, &lo, &hi);
    alignas(32) float x[8], y[8];
    _mm256_store_ps(x, a);
    _mm256_store_ps(y, lo);
    EXPECT_EQ(std::memcmp(x, y, sizeof(x)), 0) << c;
    _mm256_store_ps(x, b);
    _mm256_store_ps(y, hi);
    EXPECT_EQ(std::memcmp(x, y, sizeof(x)), 0) << c;
  }
  for (int64_t i = 32; i < 37; ++i) EXPECT_EQ(shuffled[i], row[i]);  // tail
  ShuffleLanes16(shuffled.data(), 37);
  EXPECT_EQ(shuffled, row);
}
#endif

}  // namespace
}  // namespace ops
}  // namespace mcc
