// The weight-only FP8 CUDA kernels (fp8_weight_kernels.cuh), run on the host
// through cuda_emulator.h, against the CPU kernels (core/ops/fp8_weight.cc):
// - E4M3 encoding and decoding equal core/fp8.h's bit for bit (every code;
//   every midpoint and its neighbours);
// - the quantisation's codes and scales equal the CPU's bit for bit
//   (fp32, bf16, fp16 weights; per-channel and per-tensor maxima; a zero
//   row; maxima above the rows' own), and the check names the CPU's first
//   offender;
// - both GEMM kernels (decode and tiled) are within the bound of two fp32
//   sums of the same exact products, each scaled by the same reciprocal:
//   2 B + OutputUlp (2 |want| + 2 B), B = (gamma_k + u (1 + gamma_k)) (1/s)
//   sum_p |x d| (d the decoded codes); the bound is tight enough that one
//   weight off by one code fails it (checked below).
// Each launch is the one fp8_weight.cu makes, with fewer blocks so that the
// grid-stride loops go round. Needs no GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/fp8.h"
#include "core/ops/fp8_weight.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

// After every other header: it defines CUDA's keywords as macros.
#include "core/ops/cuda/emulated_device.h"
// The kernels, after the definitions they expect.
#include "core/ops/cuda/fp8_weight_kernels.cuh"

namespace mcc {
namespace ops {
namespace {

namespace fp8w = ::mcc::cuda_kernels::fp8w;
using cuda_emu::Dim3;
using cuda_emu::Emulator;
using cuda_kernels::ElemType;

constexpr double kU = 1.0 / (1 << 24);

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

ElemType ElemOf(DType dt) {
  switch (dt) {
    case DType::kBFloat16:
      return ElemType::kBF16;
    case DType::kFloat16:
      return ElemType::kF16;
    default:
      return ElemType::kF32;
  }
}

double OutputUlp(DType dt) {
  return dt == DType::kBFloat16  ? 1.0 / 128
         : dt == DType::kFloat16 ? 1.0 / 1024
                                 : 0.0;
}

Tensor Random(const Shape& shape, uint32_t seed, DType dtype, float lo = -3.0f,
              float hi = 3.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(NumElements(shape));
  for (float& x : v) x = dist(gen);
  return *Tensor::FromVector(v, shape, dtype);
}

const DType kFloatTypes[] = {DType::kFloat32, DType::kBFloat16,
                             DType::kFloat16};

TEST(Fp8WeightEmulatedTest, DecodeEqualsTheCpuForEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float want = Fp8ToFloat(static_cast<uint8_t>(c), Fp8Format::kE4M3);
    const float got = fp8w::DecodeE4M3(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      EXPECT_EQ(Bits(got) >> 31, Bits(want) >> 31) << "code " << c;
    } else {
      EXPECT_EQ(Bits(got), Bits(want)) << "code " << c << ": " << got;
    }
  }
}

TEST(Fp8WeightEmulatedTest, EncodeEqualsTheCpu) {
  std::vector<float> codes;
  for (int c = 0; c < 127; ++c) {
    codes.push_back(Fp8ToFloat(static_cast<uint8_t>(c), Fp8Format::kE4M3));
  }
  std::vector<float> probes;
  for (size_t i = 0; i < codes.size(); ++i) {
    probes.push_back(codes[i]);
    if (i + 1 < codes.size()) {
      const float mid = codes[i] + (codes[i + 1] - codes[i]) / 2;
      for (float v :
           {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        probes.push_back(v);
      }
    }
  }
  for (float v : {464.0f, 465.0f, 1e30f, INFINITY, 1e-30f, 1e-40f,
                  std::numeric_limits<float>::quiet_NaN()}) {
    probes.push_back(v);
  }
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> e(-14.0f, 10.0f);
  for (int i = 0; i < 5000; ++i) probes.push_back(std::exp2(e(gen)));
  const size_t n = probes.size();
  for (size_t i = 0; i < n; ++i) probes.push_back(-probes[i]);
  int bad = 0;
  for (float v : probes) {
    const uint8_t want = FloatToFp8(v, Fp8Format::kE4M3);
    const uint8_t got = fp8w::EncodeE4M3(v);
    if (got != want && ++bad < 10) {
      ADD_FAILURE() << v << ": CPU 0x" << std::hex << int{want} << ", kernel 0x"
                    << int{got};
    }
  }
  EXPECT_EQ(bad, 0);
}

// The launcher's grid (blocks over rows), with fewer blocks and threads.
void RunQuantize(const Tensor& w, const Tensor& absmax, Tensor* codes,
                 Tensor* scales, unsigned long long* bad,
                 const std::function<void(const fp8w::QuantizeParams&)>& body) {
  fp8w::QuantizeParams p;
  p.w = w.raw_data();
  p.wt = ElemOf(w.dtype());
  p.absmax = absmax.data<float>();
  p.rows = w.size(0);
  p.cols = w.size(1);
  p.codes = codes->data<int8_t>();
  p.scales = scales->data<float>();
  p.bad = bad;
  const unsigned int blocks = static_cast<unsigned int>(
      std::max<int64_t>(1, std::min<int64_t>(3, p.rows)));
  Emulator::Launch(Dim3{blocks, 1, 1}, 64, 0, [&] { body(p); });
}

void ExpectSameBytes(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0)
      << what;
}

TEST(Fp8WeightEmulatedTest, QuantizeEqualsTheCpuBitForBit) {
  struct Size {
    int64_t rows, cols;
  };
  const Size sizes[] = {{1, 1}, {37, 129}, {3, 1031}, {70, 33}, {4, 0}};
  for (DType dt : kFloatTypes) {
    for (const Size& size : sizes) {
      for (Fp8WeightScaling scaling :
           {Fp8WeightScaling::kPerChannel, Fp8WeightScaling::kPerTensor}) {
        for (float widen : {1.0f, 1.5f}) {
          SCOPED_TRACE(
              absl::StrCat(DTypeName(dt), " ", size.rows, "x", size.cols, " ",
                           Fp8WeightScalingName(scaling), " x", widen));
          std::vector<float> v =
              Random({size.rows, size.cols}, 3, DType::kFloat32).ToFloats();
          if (size.rows > 2) {
            // Row 0 all zeros (scale 1); row 1 spans the subnormals.
            for (int64_t c = 0; c < size.cols; ++c) {
              v[c] = 0.0f;
              v[size.cols + c] = std::ldexp(v[size.cols + c], -c % 24);
            }
          }
          const Tensor w = *Tensor::FromVector(v, {size.rows, size.cols}, dt);
          Tensor absmax = Tensor::Empty({size.rows}, DType::kFloat32);
          ASSERT_TRUE(Fp8WeightAbsMax(w, scaling, &absmax).ok());
          std::vector<float> m = absmax.ToFloats();
          for (float& x : m) x *= widen;
          absmax = *Tensor::FromVector(m, {size.rows});
          Tensor want_codes = Tensor::Empty(w.shape(), DType::kInt8);
          Tensor want_scales = Tensor::Empty({size.rows}, DType::kFloat32);
          ASSERT_TRUE(
              QuantizeWeightFp8(w, absmax, &want_codes, &want_scales).ok());
          Tensor codes = Tensor::Full(w.shape(), 99, DType::kInt8);
          Tensor scales = Tensor::Full({size.rows}, -1, DType::kFloat32);
          unsigned long long bad = ~0ull;
          RunQuantize(
              w, absmax, &codes, &scales, &bad,
              [](const fp8w::QuantizeParams& p) { fp8w::CheckRowsBody(p); });
          EXPECT_EQ(bad, ~0ull);
          RunQuantize(
              w, absmax, &codes, &scales, &bad,
              [](const fp8w::QuantizeParams& p) { fp8w::QuantizeRowsBody(p); });
          ExpectSameBytes(codes, want_codes, "codes");
          ExpectSameBytes(scales, want_scales, "scales");
        }
      }
    }
  }
}

// Offenders at (2, 4) (above the maximum), (2, 11) (NaN), (4, 0) and
// (1, 12): the check's key is the CPU's first, (1, 12), and it writes
// neither codes nor scales.
TEST(Fp8WeightEmulatedTest, CheckFindsTheCpusFirstOffender) {
  const int64_t rows = 6, cols = 13;
  std::vector<float> v(rows * cols, 0.25f);
  v[2 * cols + 4] = 3.0f;
  v[2 * cols + 11] = NAN;
  v[4 * cols + 0] = 0.5f;
  v[1 * cols + 12] = -1.5f;
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(DTypeName(dt));
    const Tensor w = *Tensor::FromVector(v, {rows, cols}, dt);
    const Tensor absmax =
        *Tensor::FromVector({1.0f, 1.0f, 1.0f, 1.0f, 0.0f, 1.0f}, {rows});
    Tensor codes = Tensor::Full(w.shape(), 99, DType::kInt8);
    Tensor scales = Tensor::Full({rows}, -1, DType::kFloat32);
    const absl::Status cpu = QuantizeWeightFp8(w, absmax, &codes, &scales);
    ASSERT_FALSE(cpu.ok());
    EXPECT_NE(std::string(cpu.message()).find("|w[1, 12]|"), std::string::npos)
        << cpu;
    unsigned long long bad = ~0ull;
    RunQuantize(w, absmax, &codes, &scales, &bad,
                [](const fp8w::QuantizeParams& p) { fp8w::CheckRowsBody(p); });
    EXPECT_EQ(bad, 1u * cols + 12);
    for (double c : codes.ToDoubles()) ASSERT_EQ(c, 99);
    for (double s : scales.ToDoubles()) ASSERT_EQ(s, -1);
    // Without row 1's offender the first is row 2's first column.
    std::vector<float> v2 = v;
    v2[1 * cols + 12] = 0.5f;
    const Tensor w2 = *Tensor::FromVector(v2, {rows, cols}, dt);
    bad = ~0ull;
    RunQuantize(w2, absmax, &codes, &scales, &bad,
                [](const fp8w::QuantizeParams& p) { fp8w::CheckRowsBody(p); });
    EXPECT_EQ(bad, 2u * cols + 4);
  }
}

// Random E4M3 codes (no NaN) and scales in [1, 100).
Tensor RandomCodes(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(0, 255);
  Tensor codes = Tensor::Empty({n, k}, DType::kInt8);
  int8_t* q = codes.data<int8_t>();
  for (int64_t i = 0; i < n * k; ++i) {
    int c = dist(gen);
    if ((c & 0x7f) == 0x7f) c &= 0xfe;
    q[i] = static_cast<int8_t>(static_cast<uint8_t>(c));
  }
  return codes;
}

enum class GemmKernel { kSkinny, kTiled };

// The launcher's grids, with fewer blocks (and warps) so the strides go
// round.
void RunGemm(GemmKernel kernel, const Tensor& x, const Tensor& codes,
             const Tensor& scales, Tensor* y) {
  fp8w::GemmParams p;
  p.x = x.raw_data();
  p.xt = ElemOf(x.dtype());
  p.codes = codes.data<int8_t>();
  p.scales = scales.data<float>();
  p.y = y->raw_data();
  p.yt = ElemOf(y->dtype());
  p.m = x.size(0);
  p.n = codes.size(0);
  p.k = codes.size(1);
  if (p.m == 0 || p.n == 0) return;
  if (kernel == GemmKernel::kSkinny) {
    Emulator::Launch(Dim3{2, 1, 1}, 64, 0, [&] { fp8w::SkinnyGemmBody(p); });
    return;
  }
  const unsigned int n_tiles =
      static_cast<unsigned int>((p.n + fp8w::kTile - 1) / fp8w::kTile);
  const int64_t m_tiles = (p.m + fp8w::kTile - 1) / fp8w::kTile;
  Emulator::Launch(
      Dim3{n_tiles, static_cast<unsigned int>(std::min<int64_t>(2, m_tiles)),
           1},
      fp8w::kTileThreads, fp8w::kTileSharedBytes,
      [&] { fp8w::TiledGemmBody(p); });
}

// The per-element bound stated at the top; true when every element is in.
bool WithinBound(const Tensor& got, const Tensor& want, const Tensor& x,
                 const Tensor& codes, const Tensor& scales,
                 std::string* first_miss) {
  const int64_t m = x.size(0), n = codes.size(0), k = codes.size(1);
  const std::vector<double> xv = x.ToDoubles(), g = got.ToDoubles(),
                            wv = want.ToDoubles(), s = scales.ToDoubles();
  const int8_t* q = codes.data<int8_t>();
  const double gamma = k * kU / (1 - k * kU);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double abs_sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        abs_sum += std::fabs(
            xv[i * k + p] *
            Fp8ToFloat(static_cast<uint8_t>(q[j * k + p]), Fp8Format::kE4M3));
      }
      const double b = (gamma + kU * (1 + gamma)) * abs_sum / s[j] * (1 + 1e-6);
      const double w = wv[i * n + j];
      const double bound =
          2 * b + OutputUlp(want.dtype()) * (2 * std::fabs(w) + 2 * b) + 1e-30;
      if (!(std::fabs(g[i * n + j] - w) <= bound)) {
        *first_miss = absl::StrCat("y[", i, ", ", j, "] = ", g[i * n + j],
                                   ", CPU ", w, ", bound ", bound);
        return false;
      }
    }
  }
  return true;
}

struct GemmCase {
  int64_t m, n, k;
};

TEST(Fp8WeightEmulatedTest, GemmKernelsWithinTheBoundOfTheCpu) {
  const GemmCase cases[] = {{1, 1, 1},   {1, 65, 129}, {3, 33, 31},
                            {8, 17, 70}, {9, 40, 33},  {37, 70, 257},
                            {70, 33, 1}, {2, 5, 0},    {1, 9, 128},
                            {4, 20, 68}, {8, 3, 4}};
  for (DType xt : kFloatTypes) {
    for (DType yt : {xt, DType::kFloat32}) {
      for (const GemmCase& c : cases) {
        for (GemmKernel kernel : {GemmKernel::kSkinny, GemmKernel::kTiled}) {
          if (kernel == GemmKernel::kSkinny && c.m > fp8w::kSkinnyRows) {
            continue;
          }
          SCOPED_TRACE(absl::StrCat(
              DTypeName(xt), " -> ", DTypeName(yt), " m ", c.m, " n ", c.n,
              " k ", c.k,
              kernel == GemmKernel::kSkinny ? " skinny" : " tiled"));
          const Tensor x = Random({c.m, c.k}, 10, xt);
          const Tensor codes = RandomCodes(c.n, c.k, 11);
          const Tensor scales =
              Random({c.n}, 12, DType::kFloat32, 1.0f, 100.0f);
          Tensor want = Tensor::Empty({c.m, c.n}, yt);
          ASSERT_TRUE(Fp8WeightGemm(x, codes, scales, &want).ok());
          Tensor got = Tensor::Full({c.m, c.n}, NAN, yt);
          RunGemm(kernel, x, codes, scales, &got);
          std::string miss;
          EXPECT_TRUE(WithinBound(got, want, x, codes, scales, &miss)) << miss;
        }
      }
    }
  }
}

// The bound catches a kernel that reads one weight one code away (the
// comparison above can fail): the CPU's result on the codes, the kernel's on
// a copy with one code moved up by one step.
TEST(Fp8WeightEmulatedTest, OneWrongCodeFailsTheBound) {
  for (GemmKernel kernel : {GemmKernel::kSkinny, GemmKernel::kTiled}) {
    const Tensor x = Random({3, 64}, 20, DType::kFloat32, 0.5f, 1.0f);
    Tensor codes = RandomCodes(16, 64, 21);
    codes.data<int8_t>()[5 * 64 + 40] = 0x48;  // 4.0
    const Tensor scales = Random({16}, 22, DType::kFloat32, 1.0f, 10.0f);
    Tensor want = Tensor::Empty({3, 16}, DType::kFloat32);
    ASSERT_TRUE(Fp8WeightGemm(x, codes, scales, &want).ok());
    Tensor planted = codes.Clone();
    planted.data<int8_t>()[5 * 64 + 40] = 0x49;  // 4.5
    Tensor got = Tensor::Empty({3, 16}, DType::kFloat32);
    RunGemm(kernel, x, planted, scales, &got);
    std::string miss;
    EXPECT_FALSE(WithinBound(got, want, x, codes, scales, &miss));
    EXPECT_NE(miss.find("y[0, 5]"), std::string::npos) << miss;
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
