#include "core/ops/loss_totals.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/ops/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectSameOnTestDevice;

// A loss sum as ops::LossSum writes it: sum and tokens as hi/lo pairs.
Tensor LossSumOf(double sum, double tokens) {
  const float sh = static_cast<float>(sum);
  const float th = static_cast<float>(tokens);
  const float sl = std::isfinite(sum) ? static_cast<float>(sum - sh) : 0.0f;
  return *Tensor::FromVector({sh, sl, th, static_cast<float>(tokens - th)},
                             {4});
}

double Pair(const Tensor& loss_sum, int i) {
  const std::vector<float> v = loss_sum.ToFloats();
  return static_cast<double>(v[i]) + static_cast<double>(v[i + 1]);
}

TEST(LossTotalsTest, AreTheHostLoopsFloat64ValuesBitForBit) {
  constexpr int kMicroBatches = 7;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> loss(0.0, 12.0);
  std::vector<Tensor> sums;
  for (int i = 0; i < kMicroBatches; ++i) {
    // Masked token counts are fractional; one micro-batch has no tokens.
    const double tokens = i == 3 ? 0.0 : 100.0 + 37.25 * i;
    sums.push_back(LossSumOf(loss(rng) * tokens + 1e-9 * i, tokens));
  }
  // The trainer's host loop before the totals moved to the device.
  double mean_of_means = 0, sum = 0, tokens = 0;
  for (const Tensor& s : sums) {
    const double t = Pair(s, 2);
    mean_of_means += (t > 0 ? Pair(s, 0) / t : 0.0) / kMicroBatches;
    sum += Pair(s, 0);
    tokens += t;
  }
  std::vector<Tensor> args = sums;
  args.push_back(Tensor::Zeros({kLossTotalsSize}, DType::kFloat32));
  auto out = ExpectSameOnTestDevice(args, [](std::vector<Tensor>& t) {
    for (int i = 0; i < kMicroBatches; ++i) {
      absl::Status s = AccumulateLossTotals(t[i], kMicroBatches, &t.back());
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  auto got = LossTotalsFromHost(out.back().ToFloats());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->mean_of_means, mean_of_means);
  EXPECT_EQ(got->sum, sum);
  EXPECT_EQ(got->tokens, tokens);
}

TEST(LossTotalsTest, ThreePartsHoldAnyFloat64Exactly) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-80, 100);
  for (int i = 0; i < 2000; ++i) {
    const double v = std::ldexp(mantissa(rng), exponent(rng));
    // One micro-batch of one token adds v itself to each total.
    Tensor totals = Tensor::Zeros({kLossTotalsSize}, DType::kFloat32);
    ASSERT_TRUE(AccumulateLossTotals(LossSumOf(v, 1.0), 1, &totals).ok());
    const double pair = static_cast<double>(static_cast<float>(v)) +
                        static_cast<float>(v - static_cast<float>(v));
    auto got = LossTotalsFromHost(totals.ToFloats());
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->sum, pair) << v;  // The loss sum's own pair, exactly.
  }
  // An inf or NaN loss stays one.
  Tensor totals = Tensor::Zeros({kLossTotalsSize}, DType::kFloat32);
  ASSERT_TRUE(
      AccumulateLossTotals(
          LossSumOf(std::numeric_limits<double>::infinity(), 8), 2, &totals)
          .ok());
  auto got = LossTotalsFromHost(totals.ToFloats());
  EXPECT_TRUE(std::isinf(got->mean_of_means));
  EXPECT_TRUE(std::isinf(got->sum));
  EXPECT_EQ(got->tokens, 8.0);
}

TEST(LossTotalsTest, PackedTotalsAreHiLoPairs) {
  Tensor totals = Tensor::Zeros({kLossTotalsSize}, DType::kFloat32);
  ASSERT_TRUE(AccumulateLossTotals(LossSumOf(1.0 / 3.0, 3.0), 3, &totals).ok());
  ASSERT_TRUE(
      AccumulateLossTotals(LossSumOf(1e7 + 1.0 / 7.0, 5.5), 3, &totals).ok());
  const LossTotalValues exact = *LossTotalsFromHost(totals.ToFloats());
  auto out = ExpectSameOnTestDevice(
      {totals, Tensor::Zeros({kPackedLossTotalsSize}, DType::kFloat32)},
      [](std::vector<Tensor>& t) { return PackLossTotals(t[0], &t[1]); });
  const std::vector<float> p = out[1].ToFloats();
  const double values[] = {exact.mean_of_means, exact.sum, exact.tokens};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p[2 * i], static_cast<float>(values[i])) << i;
    EXPECT_EQ(p[2 * i + 1], static_cast<float>(values[i] - p[2 * i])) << i;
  }
  const LossTotalValues packed = *LossTotalsFromHost(p);
  EXPECT_NEAR(packed.sum, exact.sum, 1e-13 * exact.sum);
  EXPECT_EQ(packed.tokens, exact.tokens);
}

TEST(LossTotalsTest, BadArgumentsAreNamed) {
  Tensor totals = Tensor::Zeros({kLossTotalsSize}, DType::kFloat32);
  Tensor small = Tensor::Zeros({4}, DType::kFloat32);
  absl::Status s = AccumulateLossTotals(LossSumOf(1, 1), 0, &totals);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("0 micro-batches"), std::string::npos) << s;
  s = AccumulateLossTotals(LossSumOf(1, 1), 1, &small);
  EXPECT_NE(s.message().find("totals"), std::string::npos) << s;
  s = AccumulateLossTotals(Tensor::Zeros({3}, DType::kFloat32), 1, &totals);
  EXPECT_NE(s.message().find("loss sum"), std::string::npos) << s;
  Tensor on_device = *totals.To(Device::TestDevice());
  s = AccumulateLossTotals(LossSumOf(1, 1), 1, &on_device);
  EXPECT_FALSE(s.ok());
  s = PackLossTotals(totals, &small);
  EXPECT_NE(s.message().find("packed totals"), std::string::npos) << s;
  EXPECT_FALSE(LossTotalsFromHost(std::vector<float>(4)).ok());
}

}  // namespace
}  // namespace ops
}  // namespace mcc
