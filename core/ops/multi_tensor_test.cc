#include "core/ops/multi_tensor.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/reduce.h"
#include "core/ops/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectSameOnTestDevice;
using testing::RandomTensor;

std::vector<Tensor> Grads() {
  return {RandomTensor({300, 70}, DType::kFloat32, 1),
          RandomTensor({5}, DType::kBFloat16, 2),
          RandomTensor({200000}, DType::kFloat32, 3),
          RandomTensor({33, 3}, DType::kFloat16, 4)};
}

// What the optimizer computes today, one host value per tensor: the sum of
// the per-tensor float64 sums in order, scaled, split in two halves.
TEST(MultiTensorSumOfSquaresTest, EqualsTheSerialPerTensorSum) {
  const std::vector<Tensor> grads = Grads();
  const double scale = 1.0 / 1024;
  double want = 0.0;
  for (const Tensor& g : grads) want += *SumOfSquares(g);
  want *= scale * scale;
  Tensor out = Tensor::Full({4}, 7.0, DType::kFloat32);
  SumOfSquaresOptions options;
  options.scale = scale;
  ASSERT_TRUE(MultiTensorSumOfSquares(grads, {}, options, &out).ok());
  const std::vector<float> o = out.ToFloats();
  EXPECT_EQ(o[0], static_cast<float>(want));
  EXPECT_EQ(o[1], static_cast<float>(want - static_cast<double>(o[0])));
  EXPECT_EQ(o[2], 0.0f);
  EXPECT_EQ(o[3], 0.0f);
}

TEST(MultiTensorSumOfSquaresTest, SameOnTheTestDeviceWithoutHostCopies) {
  std::vector<Tensor> args = Grads();
  args.push_back(Tensor::Zeros({4}, DType::kFloat32));
  ExpectSameOnTestDevice(args, [](std::vector<Tensor>& t) {
    SumOfSquaresOptions options;
    options.scale = 0.5;
    options.count_zeros = true;
    return MultiTensorSumOfSquares(absl::MakeConstSpan(t.data(), 2),
                                   absl::MakeConstSpan(t.data() + 2, 2),
                                   options, &t[4]);
  });
}

TEST(MultiTensorSumOfSquaresTest, CountsZerosOfCountedTensorsOnly) {
  Tensor a = *Tensor::FromVector({0.0f, 1.0f, -0.0f, 2.0f}, {4});
  Tensor b = *Tensor::FromVector({0.0f, 0.0f, 3.0f}, {3}, DType::kBFloat16);
  Tensor c = *Tensor::FromVector({0.0f}, {1});
  Tensor out = Tensor::Zeros({4}, DType::kFloat32);
  SumOfSquaresOptions options;
  options.count_zeros = true;
  ASSERT_TRUE(MultiTensorSumOfSquares({a, b}, {c}, options, &out).ok());
  const std::vector<float> o = out.ToFloats();
  EXPECT_EQ(o[0], 14.0f);
  EXPECT_EQ(o[2] + o[3], 4.0f);
}

TEST(MultiTensorSumOfSquaresTest, NonFiniteAnywhereGivesInfinity) {
  for (float bad : {std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    Tensor good = *Tensor::FromVector({1.0f, 2.0f}, {2});
    Tensor poisoned = *Tensor::FromVector({1.0f, bad}, {2});
    Tensor out = Tensor::Zeros({4}, DType::kFloat32);
    ASSERT_TRUE(MultiTensorSumOfSquares({good}, {poisoned}, {}, &out).ok());
    EXPECT_EQ(out.ToFloats()[0], std::numeric_limits<float>::infinity());
    ASSERT_TRUE(MultiTensorSumOfSquares({poisoned}, {}, {}, &out).ok());
    EXPECT_EQ(out.ToFloats()[0], std::numeric_limits<float>::infinity());
  }
}

TEST(MultiTensorSumOfSquaresTest, RefusesMixedDevicesAndBadOutput) {
  Tensor g = Tensor::Zeros({3}, DType::kFloat32);
  Tensor dev_out = Tensor::Zeros({4}, DType::kFloat32, Device::TestDevice());
  EXPECT_FALSE(MultiTensorSumOfSquares({g}, {}, {}, &dev_out).ok());
  Tensor small = Tensor::Zeros({2}, DType::kFloat32);
  EXPECT_FALSE(MultiTensorSumOfSquares({g}, {}, {}, &small).ok());
}

}  // namespace
}  // namespace ops
}  // namespace mcc
