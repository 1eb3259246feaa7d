// The CUDA kernels of QuantizeWeightFp8 and Fp8WeightGemm
// (core/ops/fp8_weight.h) against the CPU kernels on the same random inputs,
// odd sizes, every dtype the ops take. Skips without a CUDA device (the
// *_on_test_device build runs it in CI; see test_util.h).
//
// Bounds: the quantisation is an exact function of the input bits on both
// sides (one correctly rounded division, one product, a round-to-nearest-
// even to E4M3), so codes and scales agree bit for bit, and so do the
// errors (the CPU's first offender). Fp8WeightGemm: both sides sum the
// same exact products in fp32 (different orders) and multiply by the same
// reciprocal, so they differ by at most 2 B, B = (gamma_k + u (1 + gamma_k))
// (1/s) sum_p |x d| (d the decoded codes); a 16-bit y rounds each side once
// more: 2 B + OutputUlp (2 |want| + 2 B).
#include "core/ops/fp8_weight.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/fp8.h"
#include "core/ops/cuda/test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using testing::CudaTest;
using testing::KernelDevice;
using testing::kU32;
using testing::OutputUlp;
using testing::RandomHost;
using testing::SameBytes;
using testing::ToCuda;
using testing::Values;
using testing::WithinBound;

const DType kFloatTypes[] = {DType::kFloat32, DType::kBFloat16,
                             DType::kFloat16};

// The message from "is below" on: the CPU's and the device's name the
// same element.
std::string Tail(const absl::Status& s) {
  const std::string m(s.message());
  const size_t at = m.find("absmax[");
  return at == std::string::npos ? m : m.substr(at);
}

class CudaFp8WeightTest : public CudaTest {};

TEST_F(CudaFp8WeightTest, QuantizeEqualsTheCpuBitForBit) {
  struct Size {
    int64_t rows, cols;
  };
  const Size sizes[] = {{1, 1}, {37, 129}, {3, 1031}, {70, 33}, {4, 0}};
  for (DType dt : kFloatTypes) {
    for (const Size& size : sizes) {
      for (Fp8WeightScaling scaling :
           {Fp8WeightScaling::kPerChannel, Fp8WeightScaling::kPerTensor}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dt), " ", size.rows, "x", size.cols,
                                  " ", Fp8WeightScalingName(scaling)));
        std::vector<double> wv =
            Values(RandomHost({size.rows, size.cols}, dt, 3, -3.0f, 3.0f));
        std::vector<float> wf(wv.begin(), wv.end());
        if (size.rows > 2) {
          for (int64_t c = 0; c < size.cols; ++c) wf[c] = 0.0f;  // Row 0.
        }
        const Tensor w = *Tensor::FromVector(wf, {size.rows, size.cols}, dt);
        Tensor absmax = Tensor::Empty({size.rows}, DType::kFloat32);
        ASSERT_TRUE(Fp8WeightAbsMax(w, scaling, &absmax).ok());
        Tensor ch = Tensor::Empty(w.shape(), DType::kInt8);
        Tensor sh = Tensor::Empty({size.rows}, DType::kFloat32);
        Tensor cd = Tensor::Empty(w.shape(), DType::kInt8, KernelDevice());
        Tensor sd = Tensor::Empty({size.rows}, DType::kFloat32, KernelDevice());
        ASSERT_TRUE(QuantizeWeightFp8(w, absmax, &ch, &sh).ok());
        ASSERT_TRUE(
            QuantizeWeightFp8(ToCuda(w), ToCuda(absmax), &cd, &sd).ok());
        EXPECT_TRUE(SameBytes(cd, ch));
        EXPECT_TRUE(SameBytes(sd, sh));
        // The maxima on the device too (per tensor: through AbsMax).
        Tensor md = Tensor::Empty({size.rows}, DType::kFloat32, KernelDevice());
        ASSERT_TRUE(Fp8WeightAbsMax(ToCuda(w), scaling, &md).ok());
        EXPECT_TRUE(SameBytes(md, absmax));
      }
    }
  }
}

TEST_F(CudaFp8WeightTest, QuantizeErrorsNameTheCpusElement) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(DTypeName(dt));
    std::vector<float> wf(6 * 13, 0.25f);
    wf[2 * 13 + 4] = 3.0f;  // Above row 2's maximum of 1: the first.
    wf[2 * 13 + 11] = NAN;
    wf[4 * 13 + 0] = 0.5f;  // Row 4 has maximum 0.
    const Tensor w = *Tensor::FromVector(wf, {6, 13}, dt);
    const Tensor absmax =
        *Tensor::FromVector({1.0f, 1.0f, 1.0f, 1.0f, 0.0f, 1.0f}, {6});
    Tensor ch = Tensor::Empty({6, 13}, DType::kInt8);
    Tensor sh = Tensor::Empty({6}, DType::kFloat32);
    Tensor cd = Tensor::Empty({6, 13}, DType::kInt8, KernelDevice());
    Tensor sd = Tensor::Empty({6}, DType::kFloat32, KernelDevice());
    const absl::Status cpu = QuantizeWeightFp8(w, absmax, &ch, &sh);
    const absl::Status dev =
        QuantizeWeightFp8(ToCuda(w), ToCuda(absmax), &cd, &sd);
    ASSERT_FALSE(cpu.ok());
    EXPECT_EQ(dev.code(), cpu.code()) << dev;
    EXPECT_EQ(Tail(dev), Tail(cpu));
    EXPECT_NE(Tail(dev).find("|w[2, 4]| = 3"), std::string::npos) << dev;
  }
}

// Random E4M3 codes (no NaN).
Tensor RandomCodes(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(0, 255);
  std::vector<int8_t> v(n * k);
  for (int8_t& c : v) {
    int b = dist(gen);
    if ((b & 0x7f) == 0x7f) b &= 0xfe;
    c = static_cast<int8_t>(static_cast<uint8_t>(b));
  }
  Tensor t = Tensor::Empty({n, k}, DType::kInt8);
  std::copy(v.begin(), v.end(), t.data<int8_t>());
  return t;
}

TEST_F(CudaFp8WeightTest, GemmWithinTheBoundOfTheCpu) {
  struct Case {
    int64_t m, n, k;
  };
  // m <= 8 takes the decode kernel, larger m the tiled one.
  const Case cases[] = {{1, 1, 1},      {1, 65, 129}, {3, 33, 31},
                        {8, 300, 70},   {9, 40, 33},  {37, 70, 257},
                        {70, 33, 1},    {2, 5, 0},    {1, 4096, 4096},
                        {64, 256, 1024}};
  for (DType xt : kFloatTypes) {
    for (DType yt : {xt, DType::kFloat32}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(absl::StrCat(DTypeName(xt), " -> ", DTypeName(yt), " m ",
                                  c.m, " n ", c.n, " k ", c.k));
        const Tensor x = RandomHost({c.m, c.k}, xt, 10);
        const Tensor q = RandomCodes(c.n, c.k, 11);
        const Tensor s = RandomHost({c.n}, DType::kFloat32, 12, 1.0f, 100.0f);
        Tensor yh = Tensor::Empty({c.m, c.n}, yt);
        Tensor yd = Tensor::Empty({c.m, c.n}, yt, KernelDevice());
        ASSERT_TRUE(Fp8WeightGemm(x, q, s, &yh).ok());
        ASSERT_TRUE(Fp8WeightGemm(ToCuda(x), ToCuda(q), ToCuda(s), &yd).ok());
        const std::vector<double> xv = Values(x), sv = Values(s),
                                  want = Values(yh);
        const int8_t* qp = q.data<int8_t>();
        const double gamma = c.k * kU32 / (1 - c.k * kU32);
        std::vector<double> bound(want.size());
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = 0; j < c.n; ++j) {
            double abs_sum = 0;
            for (int64_t p = 0; p < c.k; ++p) {
              abs_sum +=
                  std::fabs(xv[i * c.k + p] *
                            Fp8ToFloat(static_cast<uint8_t>(qp[j * c.k + p]),
                                       Fp8Format::kE4M3));
            }
            const double b =
                (gamma + kU32 * (1 + gamma)) * abs_sum / sv[j] * (1 + 1e-6);
            const double w = std::fabs(want[i * c.n + j]);
            bound[i * c.n + j] =
                2 * b + OutputUlp(yt) * (2 * w + 2 * b) + 1e-30;
          }
        }
        EXPECT_TRUE(WithinBound(Values(yd), want, bound));
      }
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
