// mma_tile.cuh's host emulation of mma.m16n8k16 (bf16 and fp16 inputs,
// fp32 accumulators) against a float64 product: every lane of two warps
// fills its registers from A, B and C as the PTX ISA states the fragment
// layouts element by element (a_i, b_i, c_i with their row and column
// formulas, written here independently of the emulation's lane lookups),
// runs the product, and writes D back by the C layout. Each planted layout
// fault of the emulation fails the comparison.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "gtest/gtest.h"

// After every other header: it defines CUDA's keywords as macros.
#include "core/ops/cuda/emulated_device.h"
// After the definitions it expects.
#include "core/ops/cuda/mma_tile.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using cuda_emu::Dim3;
using cuda_emu::Emulator;

constexpr int kWarps = 2;

// One warp's operands as 16-bit bits (A [16 x 16], B [16 x 8] k x n) and
// fp32 C [16 x 8], with their values as doubles.
struct Operands {
  std::vector<uint16_t> a, b;
  std::vector<float> c;
  std::vector<double> av, bv;
};

Operands Random(mma::Input in, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  Operands o;
  auto bits = [&](float v, double* value) {
    uint16_t b;
    if (in == mma::Input::kBF16) {
      const BFloat16 h = FloatToBFloat16(v);
      std::memcpy(&b, &h, 2);
      *value = BFloat16ToFloat(h);
    } else {
      const Float16 h = FloatToFloat16(v);
      std::memcpy(&b, &h, 2);
      *value = Float16ToFloat(h);
    }
    return b;
  };
  o.a.resize(16 * 16);
  o.av.resize(16 * 16);
  o.b.resize(16 * 8);
  o.bv.resize(16 * 8);
  for (int i = 0; i < 16 * 16; ++i) o.a[i] = bits(dist(gen), &o.av[i]);
  for (int i = 0; i < 16 * 8; ++i) o.b[i] = bits(dist(gen), &o.bv[i]);
  for (int i = 0; i < 16 * 8; ++i) o.c.push_back(dist(gen));
  return o;
}

// D = A B + C per warp through the emulated product.
template <mma::Input kIn>
std::vector<std::vector<float>> Run(const std::vector<Operands>& ops) {
  std::vector<std::vector<float>> d(ops.size(), std::vector<float>(16 * 8));
  Emulator::Launch(Dim3{}, 32 * kWarps, 0, [&] {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane >> 2, tig = lane % 4;  // groupID, threadID_in_group
    const Operands& o = ops[warp];
    uint16_t a[8], b[4];
    float c[4];
    for (int i = 0; i < 8; ++i) {
      const int row = (i % 4) < 2 ? group : group + 8;
      const int col = i < 4 ? tig * 2 + (i & 1) : tig * 2 + 8 + (i & 1);
      a[i] = o.a[row * 16 + col];
    }
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? tig * 2 + (i & 1) : tig * 2 + 8 + (i & 1);
      b[i] = o.b[row * 8 + group];
    }
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? group : group + 8;
      c[i] = o.c[row * 8 + tig * 2 + (i & 1)];
    }
    const uint32_t ar[4] = {mma::Pack(a[0], a[1]), mma::Pack(a[2], a[3]),
                            mma::Pack(a[4], a[5]), mma::Pack(a[6], a[7])};
    const uint32_t br[2] = {mma::Pack(b[0], b[1]), mma::Pack(b[2], b[3])};
    mma::MmaM16N8K16<kIn>(c, ar, br);
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? group : group + 8;
      d[warp][row * 8 + tig * 2 + (i & 1)] = c[i];
    }
  });
  return d;
}

// Whether every warp's D is within 17 u sum |terms| of the float64 value.
template <mma::Input kIn>
bool MatchesFloat64(uint32_t seed) {
  std::vector<Operands> ops;
  for (int w = 0; w < kWarps; ++w) ops.push_back(Random(kIn, seed + w));
  const std::vector<std::vector<float>> d = Run<kIn>(ops);
  for (int w = 0; w < kWarps; ++w) {
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 8; ++n) {
        double want = ops[w].c[m * 8 + n], mag = std::fabs(want);
        for (int k = 0; k < 16; ++k) {
          const double t = ops[w].av[m * 16 + k] * ops[w].bv[k * 8 + n];
          want += t;
          mag += std::fabs(t);
        }
        if (std::fabs(d[w][m * 8 + n] - want) > 17 * std::ldexp(mag, -24)) {
          return false;
        }
      }
    }
  }
  return true;
}

TEST(MmaTileEmulatedTest, ProductsFollowThePtxFragmentLayouts) {
  EXPECT_TRUE(MatchesFloat64<mma::Input::kBF16>(1));
  EXPECT_TRUE(MatchesFloat64<mma::Input::kF16>(10));
}

TEST(MmaTileEmulatedTest, PlantedLayoutFaultsFail) {
  for (int fault = 1; fault <= 3; ++fault) {
    mma::emulated_layout_fault = fault;
    EXPECT_FALSE(MatchesFloat64<mma::Input::kBF16>(20)) << "fault " << fault;
    mma::emulated_layout_fault = 0;
  }
}

}  // namespace
}  // namespace cuda_kernels
}  // namespace mcc
