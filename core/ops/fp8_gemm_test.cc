#include "core/ops/fp8_gemm.h"

#include <cmath>
#include <vector>

#include "core/fp8.h"
#include "core/ops/abs_max.h"
#include "core/ops/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::RandomTensor;

Tensor Scalar(float v) { return *Tensor::FromVector({v}, {1}); }

// Element (r, c) of op(x) for a row-major [rows, cols] x.
double At(const std::vector<double>& x, int64_t cols, bool trans, int64_t r,
          int64_t c) {
  return trans ? x[c * cols + r] : x[r * cols + c];
}

struct Case {
  bool trans_a, trans_b;
  DType ab_dtype, c_dtype;
  Fp8Format fa, fb;
  float beta;
};

class Fp8GemmTest : public ::testing::TestWithParam<Case> {};

// Against a float64 sum of the operands' FP8 values (each rounded from the
// fp32 product x * s), scaled by the fp32 reciprocals: within the header's
// bound.
TEST_P(Fp8GemmTest, MatchesAFloat64ReferenceOverFp8Values) {
  const Case& p = GetParam();
  const int64_t m = 7, n = 5, k = 37;
  const Tensor a = p.trans_a ? RandomTensor({k, m}, p.ab_dtype, 1, -3, 3)
                             : RandomTensor({m, k}, p.ab_dtype, 1, -3, 3);
  const Tensor b = p.trans_b
                       ? RandomTensor({n, k}, p.ab_dtype, 2, -0.02f, 0.02f)
                       : RandomTensor({k, n}, p.ab_dtype, 2, -0.02f, 0.02f);
  const float sa = 448.0f / 3.0f, sb = 57344.0f / 0.02f / 8.0f;
  Tensor c = RandomTensor({m, n}, p.c_dtype, 3);
  const std::vector<double> c0 = c.ToDoubles();
  const float alpha = 0.75f;
  ASSERT_TRUE(Fp8Gemm(a, p.trans_a, p.fa, Scalar(sa), b, p.trans_b, p.fb,
                      Scalar(sb), &c, alpha, p.beta)
                  .ok());
  const std::vector<double> av = a.ToDoubles(), bv = b.ToDoubles();
  const int64_t a_cols = a.size(1), b_cols = b.size(1);
  const double dequant = static_cast<double>(1.0f / sa) * (1.0f / sb) * alpha;
  const double u = std::ldexp(1.0, -24);
  const double gamma = k * u / (1 - k * u);
  const std::vector<double> got = c.ToDoubles();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, abs_sum = 0;
      for (int64_t q = 0; q < k; ++q) {
        const double a8 = RoundToFp8(
            static_cast<float>(At(av, a_cols, p.trans_a, i, q)) * sa, p.fa);
        const double b8 = RoundToFp8(
            static_cast<float>(At(bv, b_cols, p.trans_b, q, j)) * sb, p.fb);
        sum += a8 * b8;
        abs_sum += std::fabs(a8 * b8);
      }
      const double want = dequant * sum + p.beta * c0[i * n + j];
      double tol = (gamma + 3 * u) * std::fabs(dequant) * abs_sum +
                   2 * u * std::fabs(p.beta * c0[i * n + j]);
      if (p.c_dtype == DType::kBFloat16) tol += std::ldexp(std::fabs(want), -8);
      EXPECT_NEAR(got[i * n + j], want, tol) << i << "," << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Fp8GemmTest,
    ::testing::Values(Case{false, true, DType::kFloat32, DType::kFloat32,
                           Fp8Format::kE4M3, Fp8Format::kE4M3, 0.0f},
                      Case{false, false, DType::kBFloat16, DType::kBFloat16,
                           Fp8Format::kE5M2, Fp8Format::kE4M3, 0.0f},
                      Case{true, false, DType::kBFloat16, DType::kFloat32,
                           Fp8Format::kE5M2, Fp8Format::kE4M3, 1.0f},
                      Case{true, true, DType::kFloat32, DType::kFloat32,
                           Fp8Format::kE4M3, Fp8Format::kE5M2, 0.5f}));

// The emulation really rounds: the FP8 product differs from the exact one,
// and a value beyond the format's range saturates.
TEST(Fp8GemmRoundingTest, RoundsAndSaturates) {
  const Tensor a = *Tensor::FromVector({1.0f, 1000.0f}, {1, 2});
  const Tensor b = *Tensor::FromVector({1.0f / 3, 1.0f}, {2, 1});
  Tensor c = Tensor::Zeros({1, 1}, DType::kFloat32);
  ASSERT_TRUE(Fp8Gemm(a, false, Fp8Format::kE4M3, Scalar(1.0f), b, false,
                      Fp8Format::kE4M3, Scalar(1.0f), &c)
                  .ok());
  // 1/3 -> 0.34375 (1.375 x 2^-2, the nearest e4m3), 1000 -> 448
  // (saturated).
  EXPECT_EQ(c.ToDoubles()[0], 0.34375 + 448.0);
  // A scale brings 1000 into range: 1000 * 0.25 = 250 -> 256, then / 0.25.
  ASSERT_TRUE(Fp8Gemm(a, false, Fp8Format::kE4M3, Scalar(0.25f), b, false,
                      Fp8Format::kE4M3, Scalar(1.0f), &c)
                  .ok());
  EXPECT_EQ(c.ToDoubles()[0], 0.34375 + 1024.0);
}

TEST(Fp8GemmDeviceTest, TestDeviceAgreesWithCpu) {
  testing::ExpectSameOnTestDevice(
      {RandomTensor({6, 9}, DType::kBFloat16, 4), Scalar(30.0f),
       RandomTensor({4, 9}, DType::kBFloat16, 5), Scalar(500.0f),
       RandomTensor({6, 4}, DType::kFloat32, 6)},
      [](std::vector<Tensor>& t) {
        return Fp8Gemm(t[0], false, Fp8Format::kE4M3, t[1], t[2], true,
                       Fp8Format::kE5M2, t[3], &t[4], 1.0f, 1.0f);
      },
      "Fp8Gemm");
  testing::ExpectSameOnTestDevice(
      {RandomTensor({6, 9}, DType::kBFloat16, 4),
       Tensor::Empty({1}, DType::kFloat32)},
      [](std::vector<Tensor>& t) { return AbsMax(t[0], &t[1]); }, "AbsMax");
}

TEST(Fp8GemmErrorsTest, NamesTheTensorAtFault) {
  const Tensor a = Tensor::Zeros({2, 3}, DType::kFloat32);
  const Tensor b = Tensor::Zeros({3, 4}, DType::kFloat32);
  Tensor c = Tensor::Zeros({2, 4}, DType::kFloat32);
  const absl::Status two =
      Fp8Gemm(a, false, Fp8Format::kE4M3, Tensor::Zeros({2}, DType::kFloat32),
              b, false, Fp8Format::kE4M3, Scalar(1), &c);
  EXPECT_THAT(std::string(two.message()),
              ::testing::HasSubstr("a_scale fp32[2] must hold exactly one"));
  const absl::Status inner = Fp8Gemm(a, false, Fp8Format::kE4M3, Scalar(1), b,
                                     true, Fp8Format::kE4M3, Scalar(1), &c);
  EXPECT_THAT(std::string(inner.message()),
              ::testing::HasSubstr("inner dimensions differ"));
  Tensor wrong_c = Tensor::Zeros({4, 2}, DType::kFloat32);
  EXPECT_FALSE(Fp8Gemm(a, false, Fp8Format::kE4M3, Scalar(1), b, false,
                       Fp8Format::kE4M3, Scalar(1), &wrong_c)
                   .ok());
  const absl::Status int_scale =
      Fp8Gemm(a, false, Fp8Format::kE4M3, Tensor::Zeros({1}, DType::kInt32), b,
              false, Fp8Format::kE4M3, Scalar(1), &c);
  EXPECT_THAT(std::string(int_scale.message()),
              ::testing::HasSubstr("a_scale"));
}

TEST(AbsMaxTest, LargestMagnitudeNanAndEmpty) {
  Tensor amax = Tensor::Empty({1}, DType::kFloat32);
  ASSERT_TRUE(
      AbsMax(*Tensor::FromVector({0.5f, -3.25f, 2.0f}, {3}), &amax).ok());
  EXPECT_EQ(amax.ToDoubles()[0], 3.25);
  // Many blocks (parallel chunks) and bf16.
  std::vector<float> big(300000, 0.125f);
  big[123457] = -7.0f;
  ASSERT_TRUE(
      AbsMax(*Tensor::FromVector(big, {300000}, DType::kBFloat16), &amax).ok());
  EXPECT_EQ(amax.ToDoubles()[0], 7.0);
  big[299999] = NAN;
  ASSERT_TRUE(AbsMax(*Tensor::FromVector(big, {300000}), &amax).ok());
  EXPECT_TRUE(std::isnan(amax.ToDoubles()[0]));
  ASSERT_TRUE(AbsMax(Tensor::Zeros({0, 4}, DType::kFloat32), &amax).ok());
  EXPECT_EQ(amax.ToDoubles()[0], 0.0);
  Tensor two = Tensor::Empty({2}, DType::kFloat32);
  EXPECT_FALSE(AbsMax(Tensor::Zeros({3}, DType::kFloat32), &two).ok());
}

}  // namespace
}  // namespace ops
}  // namespace mcc
