// The FP8 kernels' bodies (fp8_kernels.cuh) under the CUDA emulator, against
// core/fp8.h: every code's value and every midpoint between neighbours
// round as the CPU rounds them, bit for bit; the scaled cast over many
// blocks; the |x| maximum with zeros, infinities and NaN.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "core/ops/cuda/cuda_emulator.h"
#include "core/ops/cuda/fp8_kernels.cuh"
#include "gtest/gtest.h"

namespace mcc {
namespace {

namespace fp8 = ::mcc::cuda_kernels::fp8;
using cuda_emu::Dim3;
using cuda_emu::Emulator;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

fp8::Format FormatOf(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? fp8::E4M3() : fp8::E5M2();
}

// Every code, the midpoints between neighbouring codes and the floats just
// beside them, beyond the maximum, infinities and zeros, both signs.
std::vector<float> Probes(Fp8Format format) {
  std::vector<float> values;
  std::vector<float> codes;
  for (int c = 0; c < 128; ++c) {
    const float v = Fp8ToFloat(static_cast<uint8_t>(c), format);
    if (std::isfinite(v)) codes.push_back(v);
  }
  std::sort(codes.begin(), codes.end());
  for (size_t i = 0; i < codes.size(); ++i) {
    values.push_back(codes[i]);
    if (i + 1 < codes.size()) {
      const float mid = codes[i] + (codes[i + 1] - codes[i]) / 2;
      values.push_back(mid);
      values.push_back(std::nextafter(mid, 0.0f));
      values.push_back(std::nextafter(mid, INFINITY));
    }
  }
  const float max = Fp8Max(format);
  for (float v : {max * 1.03125f, max * 2, 1e30f, INFINITY, 1e-30f, 0.0f}) {
    values.push_back(v);
  }
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> e(-20.0f, 18.0f);
  for (int i = 0; i < 2000; ++i) values.push_back(std::exp2(e(gen)));
  const size_t n = values.size();
  for (size_t i = 0; i < n; ++i) values.push_back(-values[i]);
  values.push_back(std::numeric_limits<float>::quiet_NaN());
  return values;
}

TEST(Fp8EmulatedTest, RoundingMatchesTheCpuBitForBit) {
  for (Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    int bad = 0;
    for (float v : Probes(format)) {
      const float want = RoundToFp8(v, format);
      const float got = fp8::RoundToFp8(v, FormatOf(format));
      const bool same =
          std::isnan(want) ? std::isnan(got) : Bits(want) == Bits(got);
      if (!same && ++bad < 10) {
        ADD_FAILURE() << Fp8FormatName(format) << " " << v << ": CPU " << want
                      << ", kernel " << got;
      }
    }
    EXPECT_EQ(bad, 0) << Fp8FormatName(format);
  }
}

TEST(Fp8EmulatedTest, CodesMatchTheCpuBitForBit) {
  for (Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    int bad = 0;
    for (float v : Probes(format)) {
      const uint8_t want = FloatToFp8(v, format);
      const uint8_t got =
          fp8::Fp8Bits(fp8::RoundToFp8(v, FormatOf(format)), FormatOf(format));
      if (got != want && ++bad < 10) {
        ADD_FAILURE() << Fp8FormatName(format) << " " << v << ": CPU "
                      << int{want} << ", kernel " << int{got};
      }
    }
    EXPECT_EQ(bad, 0) << Fp8FormatName(format);
  }
}

struct VectorLoad {
  const float* p;
  float operator()(int64_t i) const { return p[i]; }
};

struct VectorStore {
  float* p;
  void operator()(int64_t i, float v) const { p[i] = v; }
};

TEST(Fp8EmulatedTest, ScaledCastOverManyBlocks) {
  std::mt19937 gen(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int64_t n = 3 * 64 + 17;  // Three blocks of 64 and a remainder.
  std::vector<float> x(n), out(n, -1.0f);
  for (float& v : x) v = nd(gen);
  const float scale = 37.5f;
  for (Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    Emulator::Launch(Dim3{2, 1, 1}, 64, 0, [&] {
      fp8::CastRange(VectorLoad{x.data()}, VectorStore{out.data()}, &scale,
                     FormatOf(format), n);
    });
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bits(out[i]), Bits(RoundToFp8(x[i] * scale, format)))
          << Fp8FormatName(format) << " element " << i;
    }
  }
}

// The byte cast, plain and transposed, over several blocks.
TEST(Fp8EmulatedTest, ByteCastPlainAndTransposed) {
  std::mt19937 gen(4);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int64_t rows = 7, cols = 37;
  std::vector<float> x(rows * cols);
  for (float& v : x) v = nd(gen);
  const float scale = 20.0f;
  for (Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (bool transpose : {false, true}) {
      std::vector<uint8_t> out(rows * cols, 0xaa);
      Emulator::Launch(Dim3{2, 1, 1}, 64, 0, [&] {
        fp8::CastBytesRange(VectorLoad{x.data()}, out.data(), &scale,
                            FormatOf(format), rows, cols, transpose);
      });
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t at = transpose ? c * rows + r : r * cols + c;
          ASSERT_EQ(out[at], FloatToFp8(x[r * cols + c] * scale, format))
              << Fp8FormatName(format) << " transpose " << transpose << " ("
              << r << ", " << c << ")";
        }
      }
    }
  }
}

struct AbsBitsLoad {
  const float* p;
  uint32_t operator()(int64_t i) const { return fp8::AbsBits(p[i]); }
};

struct WordLoad {
  const uint32_t* p;
  uint32_t operator()(int64_t i) const { return p[i]; }
};

// The launcher's two passes: blocks of 64 over x, then one block over the
// partial maxima.
float AbsMaxOf(const std::vector<float>& x, unsigned int blocks) {
  std::vector<uint32_t> partial(blocks, 12345u);
  uint32_t out = 777u;
  const int64_t n = static_cast<int64_t>(x.size());
  Emulator::Launch(Dim3{blocks, 1, 1}, 64, 64 * sizeof(uint32_t), [&] {
    fp8::MaxBitsBlock(AbsBitsLoad{x.data()}, n,
                      reinterpret_cast<uint32_t*>(Emulator::Current().shared()),
                      partial.data());
  });
  Emulator::Launch(Dim3{1, 1, 1}, 64, 64 * sizeof(uint32_t), [&] {
    fp8::MaxBitsBlock(WordLoad{partial.data()}, blocks,
                      reinterpret_cast<uint32_t*>(Emulator::Current().shared()),
                      &out);
  });
  float f;
  std::memcpy(&f, &out, sizeof(f));
  return f;
}

TEST(Fp8EmulatedTest, AbsMaxWithZerosInfinitiesAndNan) {
  std::mt19937 gen(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(1000);
  for (float& v : x) v = nd(gen);
  x[617] = -9.25f;  // The largest magnitude, negative, in a late block.
  EXPECT_EQ(AbsMaxOf(x, 4), 9.25f);
  EXPECT_EQ(AbsMaxOf(x, 1), 9.25f);
  EXPECT_EQ(AbsMaxOf(std::vector<float>(130, 0.0f), 3), 0.0f);
  EXPECT_EQ(AbsMaxOf({}, 1), 0.0f);
  x[3] = -INFINITY;
  EXPECT_EQ(AbsMaxOf(x, 4), INFINITY);
  x[999] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(AbsMaxOf(x, 4)));
}

}  // namespace
}  // namespace mcc
