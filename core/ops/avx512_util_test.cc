#include "core/ops/avx512_util.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/ops/cpu_isa.h"
#include "core/ops/kernel_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

// Values that test conversions and exp: random floats over many binades,
// the bf16 and fp16 halfway cases either side of even and odd, NaNs with
// payloads, infinities, zeros, fp32 denormals, and exp's clamp limits.
std::vector<float> TestValues() {
  std::vector<float> v = {
      0.0f,   -0.0f,    INFINITY,  -INFINITY, std::nanf(""), -std::nanf(""),
      1e-39f, -1e-39f,  1.17e-38f, 88.7f,     89.0f,         -87.3f,
      -88.0f, -1000.0f, 65504.0f,  65520.0f,  3.4e38f,       -3.4e38f};
  uint32_t bits[] = {
      0x3f808000,  // bf16 tie, even below: down
      0x3f818000,  // bf16 tie, odd below: up
      0x3f807fff, 0x3f808001, 0xbf808000, 0xbf818000,
      0x7f7f8000,  // tie at the largest finite: rounds to infinity
      0x7fc12345,  // quiet NaN with payload
      0x7f812345,  // signalling NaN: made quiet
      0x00008000,  // denormal tie
      0x3f801000,  // fp16 tie (1 + 2^-11)
      0x3f803000,
  };
  for (uint32_t b : bits) {
    float f;
    std::memcpy(&f, &b, sizeof(f));
    v.push_back(f);
  }
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-40, 40);
  while (v.size() % 16 != 0 || v.size() < 16 * 64) {
    v.push_back(std::ldexp(mant(gen), ex(gen)));
  }
  return v;
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class Avx512UtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CpuSupportsAvx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  }
};

template <typename T>
MCC_AVX512_TARGET void StoreAll16(const std::vector<float>& v, T* out) {
  for (size_t i = 0; i < v.size(); i += 16) {
    Store16F32(out + i, _mm512_loadu_ps(v.data() + i));
  }
}

template <typename T>
void StoreAll8(const std::vector<float>& v, T* out) {
  for (size_t i = 0; i < v.size(); i += 8) {
    Store8(out + i, _mm256_loadu_ps(v.data() + i));
  }
}

TEST_F(Avx512UtilTest, Store16EqualsStore8BitForBit) {
  const std::vector<float> v = TestValues();
  std::vector<BFloat16> b16(v.size()), b8(v.size());
  StoreAll16(v, b16.data());
  StoreAll8(v, b8.data());
  EXPECT_EQ(Bytes(b16), Bytes(b8));
  for (size_t i = 0; i < v.size(); ++i) {
    const BFloat16 want = FloatToBFloat16(v[i]);
    ASSERT_EQ(std::memcmp(&b16[i], &want, sizeof(want)), 0) << v[i];
  }
  std::vector<Float16> h16(v.size()), h8(v.size());
  StoreAll16(v, h16.data());
  StoreAll8(v, h8.data());
  EXPECT_EQ(Bytes(h16), Bytes(h8));
  std::vector<float> f16(v.size());
  StoreAll16(v, f16.data());
  EXPECT_EQ(Bytes(f16), Bytes(v));
}

template <typename T>
MCC_AVX512_TARGET void LoadAll16(const std::vector<T>& v, float* out) {
  for (size_t i = 0; i < v.size(); i += 16) {
    _mm512_storeu_ps(out + i, Load16F32(v.data() + i));
  }
}

template <typename T>
void ExpectLoad16EqualsLoad8(const std::vector<float>& v) {
  std::vector<T> src(v.size());
  StoreAll8(v, src.data());
  std::vector<float> l16(v.size()), l8(v.size());
  LoadAll16(src, l16.data());
  for (size_t i = 0; i < v.size(); i += 8) {
    _mm256_storeu_ps(l8.data() + i, Load8(src.data() + i));
  }
  EXPECT_EQ(Bytes(l16), Bytes(l8));
}

TEST_F(Avx512UtilTest, Load16EqualsLoad8BitForBit) {
  const std::vector<float> v = TestValues();
  ExpectLoad16EqualsLoad8<float>(v);
  ExpectLoad16EqualsLoad8<BFloat16>(v);
  ExpectLoad16EqualsLoad8<Float16>(v);
}

MCC_AVX512_TARGET void ExpAll16(const std::vector<float>& v, float* out) {
  for (size_t i = 0; i < v.size(); i += 16) {
    _mm512_storeu_ps(out + i, Exp16(_mm512_loadu_ps(v.data() + i)));
  }
}

TEST_F(Avx512UtilTest, Exp16EqualsExp8BitForBit) {
  std::vector<float> v = TestValues();
  // And a fine sweep over exp's whole range.
  for (float x = -90.0f; x < 90.0f; x += 0.0137f) v.push_back(x);
  while (v.size() % 16 != 0) v.push_back(0.5f);
  std::vector<float> e16(v.size()), e8(v.size());
  ExpAll16(v, e16.data());
  for (size_t i = 0; i < v.size(); i += 8) {
    _mm256_storeu_ps(e8.data() + i, Exp8(_mm256_loadu_ps(v.data() + i)));
  }
  EXPECT_EQ(Bytes(e16), Bytes(e8));
}

template <typename T>
MCC_AVX512_TARGET void LoadUpTo(const T* p, int64_t n, float* out) {
  _mm512_storeu_ps(out, LoadUpTo16F32(p, n));
}
template <typename T>
MCC_AVX512_TARGET void StoreUpTo(const float* v, int64_t n, T* out) {
  StoreUpTo16F32(out, _mm512_loadu_ps(v), n);
}

// The first n of 16 as the full-width helpers move them; the rest read as 0
// and left unwritten (a sentinel stays).
template <typename T>
void ExpectUpTo16MovesOnlyTheFirstN(const std::vector<float>& v) {
  std::vector<T> src(v.size()), full(v.size());
  StoreAll8(v, src.data());
  StoreAll16(v, full.data());
  std::vector<float> loaded(v.size());
  LoadAll16(src, loaded.data());
  for (size_t i = 0; i + 16 <= v.size(); i += 16) {
    for (int64_t n = 0; n <= 16; ++n) {
      float got[16];
      LoadUpTo(src.data() + i, n, got);
      for (int64_t j = 0; j < 16; ++j) {
        const float want = j < n ? loaded[i + j] : 0.0f;
        ASSERT_EQ(std::memcmp(&got[j], &want, sizeof(float)), 0)
            << "load i " << i << " n " << n << " lane " << j;
      }
      std::vector<T> out(16);
      std::memset(out.data(), 0x5a, 16 * sizeof(T));
      StoreUpTo(v.data() + i, n, out.data());
      for (int64_t j = 0; j < 16; ++j) {
        T want = full[i + j];
        if (j >= n) std::memset(&want, 0x5a, sizeof(T));
        ASSERT_EQ(std::memcmp(&out[j], &want, sizeof(T)), 0)
            << "store i " << i << " n " << n << " lane " << j;
      }
    }
  }
}

TEST_F(Avx512UtilTest, UpTo16MovesTheFirstNAsTheFullHelpersDo) {
  const std::vector<float> v = TestValues();
  ExpectUpTo16MovesOnlyTheFirstN<float>(v);
  ExpectUpTo16MovesOnlyTheFirstN<BFloat16>(v);
  ExpectUpTo16MovesOnlyTheFirstN<Float16>(v);
}

}  // namespace
}  // namespace ops
}  // namespace mcc
