#include "core/ops/fp8_weight.h"

#include <cmath>
#include <vector>

#include "core/fp8.h"
#include "core/ops/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::RandomTensor;

class Fp8WeightTest
    : public ::testing::TestWithParam<std::tuple<Fp8WeightScaling, DType>> {};

// Scales and codes against a float64 reading of the definition, then the
// dequantised GEMM against a float64 sum within the stated bound.
TEST_P(Fp8WeightTest, QuantizesAndMultipliesAsDefined) {
  const auto [scaling, dtype] = GetParam();
  const int64_t m = 5, n = 7, k = 33;
  // Rows of very different magnitudes, and one zero row.
  std::vector<float> wv(n * k);
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<double> row =
        RandomTensor({k}, DType::kFloat32, 10 + r).ToDoubles();
    for (int64_t c = 0; c < k; ++c) {
      wv[r * k + c] =
          r == 3 ? 0.0f : static_cast<float>(row[c] * std::pow(4.0, r - 3));
    }
  }
  const Tensor w = *Tensor::FromVector(wv, {n, k}, dtype);
  const std::vector<double> wd = w.ToDoubles();
  Tensor codes = Tensor::Empty({n, k}, DType::kInt8);
  Tensor scales = Tensor::Empty({n}, DType::kFloat32);
  Tensor absmax = Tensor::Empty({n}, DType::kFloat32);
  ASSERT_TRUE(Fp8WeightAbsMax(w, scaling, &absmax).ok());
  ASSERT_TRUE(QuantizeWeightFp8(w, absmax, &codes, &scales).ok());
  // Half of bf16's bytes.
  EXPECT_EQ(codes.nbytes() * 2, static_cast<size_t>(n * k * 2));
  std::vector<double> max(n, 0.0);
  double all = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c)
      max[r] = std::max(max[r], std::fabs(wd[r * k + c]));
    all = std::max(all, max[r]);
  }
  const std::vector<double> s = scales.ToDoubles();
  const int8_t* q = codes.data<int8_t>();
  for (int64_t r = 0; r < n; ++r) {
    const double basis = scaling == Fp8WeightScaling::kPerTensor ? all : max[r];
    const double want = basis > 0 ? static_cast<float>(448.0 / basis) : 1.0;
    EXPECT_NEAR(s[r], want, 1e-7 * want) << "row " << r;
    for (int64_t c = 0; c < k; ++c) {
      const float product =
          static_cast<float>(wd[r * k + c]) * static_cast<float>(s[r]);
      ASSERT_EQ(static_cast<uint8_t>(q[r * k + c]),
                FloatToFp8(product, Fp8Format::kE4M3))
          << r << "," << c;
      // Dequantised within half an E4M3 step (2^-4 relative) or the
      // subnormal spacing.
      const double dq =
          Fp8ToFloat(static_cast<uint8_t>(q[r * k + c]), Fp8Format::kE4M3) /
          s[r];
      EXPECT_LE(std::fabs(dq - wd[r * k + c]),
                std::fabs(wd[r * k + c]) / 16 + std::ldexp(1.0, -10) / s[r]);
    }
  }
  const Tensor x = RandomTensor({m, k}, dtype, 3);
  Tensor y = Tensor::Empty({m, n}, dtype);
  ASSERT_TRUE(Fp8WeightGemm(x, codes, scales, &y).ok());
  const std::vector<double> xd = x.ToDoubles(), got = y.ToDoubles();
  const double u = std::ldexp(1.0, -24), gamma = k * u / (1 - k * u);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, abs_sum = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double v =
            xd[i * k + c] *
            Fp8ToFloat(static_cast<uint8_t>(q[j * k + c]), Fp8Format::kE4M3);
        sum += v;
        abs_sum += std::fabs(v);
      }
      const double inv = 1.0f / static_cast<float>(s[j]);
      const double want = sum * inv;
      double tol = (gamma + 2 * u) * inv * abs_sum;
      if (dtype == DType::kBFloat16) tol += std::ldexp(std::fabs(want), -8);
      EXPECT_NEAR(got[i * n + j], want, tol) << i << "," << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Fp8WeightTest,
    ::testing::Combine(::testing::Values(Fp8WeightScaling::kPerChannel,
                                         Fp8WeightScaling::kPerTensor),
                       ::testing::Values(DType::kFloat32, DType::kBFloat16)));

// Per-channel keeps small rows precise where per-tensor flushes them.
TEST(Fp8WeightScalingTest, PerChannelKeepsSmallRows) {
  const Tensor w = *Tensor::FromVector({100.0f, -50.0f, 1e-5f, 3e-5f}, {2, 2});
  const Tensor x = *Tensor::FromVector({1.0f, 1.0f}, {1, 2});
  for (const auto scaling :
       {Fp8WeightScaling::kPerChannel, Fp8WeightScaling::kPerTensor}) {
    Tensor codes = Tensor::Empty({2, 2}, DType::kInt8);
    Tensor scales = Tensor::Empty({2}, DType::kFloat32);
    Tensor absmax = Tensor::Empty({2}, DType::kFloat32);
    ASSERT_TRUE(Fp8WeightAbsMax(w, scaling, &absmax).ok());
    ASSERT_TRUE(QuantizeWeightFp8(w, absmax, &codes, &scales).ok());
    Tensor y = Tensor::Empty({1, 2}, DType::kFloat32);
    ASSERT_TRUE(Fp8WeightGemm(x, codes, scales, &y).ok());
    const std::vector<double> v = y.ToDoubles();
    EXPECT_EQ(v[0], 50.0) << Fp8WeightScalingName(scaling);
    if (scaling == Fp8WeightScaling::kPerChannel) {
      EXPECT_NEAR(v[1], 4e-5, 4e-5 / 16);
    } else {
      EXPECT_EQ(v[1],
                0.0);  // 4.5e-5 and 1.3e-4 round to 0 (E4M3 stops at 2^-9).
    }
  }
}

TEST(Fp8WeightDeviceTest, TestDeviceAgreesWithCpu) {
  testing::ExpectSameOnTestDevice(
      {RandomTensor({6, 9}, DType::kBFloat16, 4),
       Tensor::Full({6}, 1.0, DType::kFloat32),
       Tensor::Empty({6, 9}, DType::kInt8),
       Tensor::Empty({6}, DType::kFloat32)},
      [](std::vector<Tensor>& t) {
        return QuantizeWeightFp8(t[0], t[1], &t[2], &t[3]);
      },
      "QuantizeWeightFp8");
  const Tensor w = RandomTensor({4, 9}, DType::kFloat32, 5);
  Tensor absmax = Tensor::Empty({4}, DType::kFloat32);
  Tensor codes = Tensor::Empty({4, 9}, DType::kInt8);
  Tensor scales = Tensor::Empty({4}, DType::kFloat32);
  ASSERT_TRUE(Fp8WeightAbsMax(w, Fp8WeightScaling::kPerTensor, &absmax).ok());
  ASSERT_TRUE(QuantizeWeightFp8(w, absmax, &codes, &scales).ok());
  testing::ExpectSameOnTestDevice(
      {RandomTensor({3, 9}, DType::kFloat32, 6), codes, scales,
       Tensor::Empty({3, 4}, DType::kFloat32)},
      [](std::vector<Tensor>& t) {
        return Fp8WeightGemm(t[0], t[1], t[2], &t[3]);
      },
      "Fp8WeightGemm");
}

TEST(Fp8WeightErrorsTest, NameTheTensor) {
  Tensor codes = Tensor::Empty({2, 3}, DType::kInt8);
  Tensor scales = Tensor::Empty({3}, DType::kFloat32);
  EXPECT_THAT(
      std::string(QuantizeWeightFp8(Tensor::Zeros({2, 3}, DType::kFloat32),
                                    Tensor::Zeros({3}, DType::kFloat32), &codes,
                                    &scales)
                      .message()),
      ::testing::HasSubstr("scales fp32[3]"));
  Tensor two = Tensor::Empty({2}, DType::kFloat32);
  EXPECT_THAT(
      std::string(QuantizeWeightFp8(Tensor::Full({2, 3}, 2.0, DType::kFloat32),
                                    Tensor::Full({2}, 1.0, DType::kFloat32),
                                    &codes, &two)
                      .message()),
      ::testing::HasSubstr("absmax[0] = 1 is below |w[0, 0]| = 2"));
  Tensor y = Tensor::Empty({1, 2}, DType::kFloat32);
  EXPECT_FALSE(
      Fp8WeightGemm(Tensor::Zeros({1, 4}, DType::kFloat32), codes, two, &y)
          .ok());
}

}  // namespace
}  // namespace ops
}  // namespace mcc
