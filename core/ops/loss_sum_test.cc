#include "core/ops/loss_sum.h"

#include <vector>

#include "core/ops/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectSameOnTestDevice;
using testing::RandomTensor;

constexpr int64_t kIgnore = -100;

Tensor Labels(int64_t n, DType dtype) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i % 5 == 3 ? kIgnore : i % 17;
  return *Tensor::FromInts(v, {n}, dtype);
}

double Join(const std::vector<float>& o, int i) {
  return static_cast<double>(o[i]) + static_cast<double>(o[i + 1]);
}

TEST(LossSumTest, EqualsTheSerialMaskedSum) {
  const int64_t n = 1000;
  Tensor loss = RandomTensor({n}, DType::kFloat32, 1, 0.0f, 10.0f);
  Tensor mask = RandomTensor({n}, DType::kFloat32, 2, 0.0f, 1.0f);
  for (DType ld : {DType::kInt32, DType::kInt64}) {
    Tensor labels = Labels(n, ld);
    for (bool masked : {false, true}) {
      Tensor out = Tensor::Zeros({4}, DType::kFloat32);
      auto res = ExpectSameOnTestDevice(
          {loss, masked ? mask : Tensor(), labels, out},
          [](std::vector<Tensor>& t) {
            return LossSum(t[0], t[1], t[2], kIgnore, false, &t[3]);
          });
      // The loop of GPTModel's loss today.
      const std::vector<float> lv = loss.ToFloats(), mv = mask.ToFloats();
      const std::vector<double> yv = labels.ToDoubles();
      double sum = 0.0, tokens = 0.0;
      for (int64_t t = 0; t < n; ++t) {
        if (yv[t] == kIgnore) continue;
        const float m = masked ? mv[t] : 1.0f;
        sum += static_cast<double>(lv[t]) * m;
        tokens += m;
      }
      const std::vector<float> o = res[3].ToFloats();
      EXPECT_EQ(o[0], static_cast<float>(sum));
      EXPECT_EQ(o[1], static_cast<float>(sum - static_cast<float>(sum)));
      EXPECT_EQ(o[2], static_cast<float>(tokens));
      if (!masked) EXPECT_EQ(Join(o, 2), 800.0);
    }
  }
}

TEST(LossSumTest, AccumulatesOverMicroBatches) {
  const int64_t n = 64;
  Tensor l1 = RandomTensor({n}, DType::kFloat32, 3, 0.0f, 5.0f);
  Tensor l2 = RandomTensor({n}, DType::kFloat32, 4, 0.0f, 5.0f);
  Tensor labels = Labels(n, DType::kInt64);
  Tensor total = Tensor::Zeros({4}, DType::kFloat32);
  Tensor one = Tensor::Zeros({4}, DType::kFloat32);
  ASSERT_TRUE(LossSum(l1, Tensor(), labels, kIgnore, false, &total).ok());
  ASSERT_TRUE(LossSum(l2, Tensor(), labels, kIgnore, true, &total).ok());
  ASSERT_TRUE(LossSum(l1, Tensor(), labels, kIgnore, false, &one).ok());
  const double first = Join(one.ToFloats(), 0);
  ASSERT_TRUE(LossSum(l2, Tensor(), labels, kIgnore, false, &one).ok());
  const double second = Join(one.ToFloats(), 0);
  const std::vector<float> o = total.ToFloats();
  // Both halves of each term are exact to 2^-48 relative; so is the total.
  EXPECT_NEAR(Join(o, 0), first + second, (first + second) * 0x1p-46);
  EXPECT_EQ(Join(o, 2), 2.0 * 51);  // 51 of 64 tokens have a label.
}

TEST(LossSumGradientTest, IsMaskOverTokenCountTimesScale) {
  const int64_t n = 50;
  Tensor loss = RandomTensor({n}, DType::kFloat32, 5, 0.0f, 5.0f);
  Tensor mask = RandomTensor({n}, DType::kFloat32, 6, 0.0f, 1.0f);
  Tensor labels = Labels(n, DType::kInt64);
  Tensor sum = Tensor::Zeros({4}, DType::kFloat32);
  ASSERT_TRUE(LossSum(loss, mask, labels, kIgnore, false, &sum).ok());
  Tensor dloss = Tensor::Zeros({n}, DType::kFloat32);
  auto res =
      ExpectSameOnTestDevice({sum, mask, dloss}, [](std::vector<Tensor>& t) {
        return LossSumGradient(t[0], t[1], 8.0f, &t[2]);
      });
  const double tokens = Join(sum.ToFloats(), 2);
  const float s = 8.0f / static_cast<float>(tokens);
  const std::vector<float> mv = mask.ToFloats(), got = res[2].ToFloats();
  for (int64_t t = 0; t < n; ++t) EXPECT_EQ(got[t], mv[t] * s);
  // No tokens: zero gradient, no division by zero.
  Tensor empty = Tensor::Zeros({4}, DType::kFloat32);
  ASSERT_TRUE(LossSumGradient(empty, Tensor(), 1.0f, &dloss).ok());
  EXPECT_EQ(dloss.ToFloats(), std::vector<float>(n, 0.0f));
}

TEST(LossSumTest, RefusesMismatchedShapes) {
  Tensor loss = Tensor::Zeros({8}, DType::kFloat32);
  Tensor labels = Tensor::Zeros({7}, DType::kInt64);
  Tensor out = Tensor::Zeros({4}, DType::kFloat32);
  EXPECT_FALSE(LossSum(loss, Tensor(), labels, kIgnore, false, &out).ok());
  Tensor labels8 = Tensor::Zeros({8}, DType::kInt64);
  Tensor bad_mask = Tensor::Zeros({8}, DType::kBFloat16);
  EXPECT_FALSE(LossSum(loss, bad_mask, labels8, kIgnore, false, &out).ok());
  Tensor out3 = Tensor::Zeros({3}, DType::kFloat32);
  EXPECT_FALSE(LossSum(loss, Tensor(), labels8, kIgnore, false, &out3).ok());
}

}  // namespace
}  // namespace ops
}  // namespace mcc
