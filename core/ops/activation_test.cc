#include "core/ops/activation.h"

#include <cmath>
#include <vector>

#include "core/ops/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::Bytes;
using testing::NumericGrad;
using testing::RandomTensor;

double GeluRef(double v) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * v * (1.0 + std::tanh(s * (v + 0.044715 * v * v * v)));
}

std::vector<double> RefBiasGelu(const std::vector<double>& x,
                                const std::vector<double>& b) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    y[i] = GeluRef(x[i] + (b.empty() ? 0.0 : b[i % b.size()]));
  }
  return y;
}

std::vector<double> RefSwiGLU(const std::vector<double>& x, int64_t h) {
  const int64_t rows = x.size() / (2 * h);
  std::vector<double> y(rows * h);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < h; ++j) {
      const double a = x[r * 2 * h + j], b = x[r * 2 * h + h + j];
      y[r * h + j] = a / (1.0 + std::exp(-a)) * b;
    }
  }
  return y;
}

// fp32 arithmetic with a vectorised exp: a few ulp of the result's scale.
constexpr double kF32Atol = 2e-6, kF32Rtol = 1e-5;
// bf16 output: one rounding to 8 significant bits, at most 2^-8 relative
// (bf16's unit roundoff), on top of the fp32 error.
constexpr double kBf16Rtol = 1.0 / 256 + 1e-5;
// fp16 output: 11 significant bits, at most 2^-11 relative.
constexpr double kF16Rtol = 1.0 / 2048 + 1e-5;
// The output tolerance for dt, f32 for fp32.
double Rtol(DType dt, double f32) {
  if (dt == DType::kFloat32) return f32;
  return dt == DType::kBFloat16 ? kBf16Rtol : kF16Rtol;
}

TEST(ActivationTest, GeluForward) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const Shape& shape : {Shape{1}, Shape{7, 33}, Shape{129, 300}}) {
      Tensor x = RandomTensor(shape, dt, 1, -6.0f, 6.0f);
      Tensor y = Tensor::Zeros(shape, dt);
      ASSERT_TRUE(Gelu(x, &y).ok());
      testing::ExpectAllNear(y.ToDoubles(), RefBiasGelu(x.ToDoubles(), {}),
                             kF32Atol, Rtol(dt, kF32Rtol), y.Describe());
    }
  }
}

TEST(ActivationTest, GeluBackwardMatchesFiniteDifferences) {
  const Shape shape{7, 33};
  Tensor x = RandomTensor(shape, DType::kFloat32, 2, -4.0f, 4.0f);
  Tensor dy = RandomTensor(shape, DType::kFloat32, 3);
  Tensor dx = Tensor::Zeros(shape, DType::kFloat32);
  ASSERT_TRUE(GeluBackward(dy, x, &dx).ok());
  const std::vector<double> dyv = dy.ToDoubles();
  auto loss = [&](const std::vector<double>& xv) {
    return testing::Dot(dyv, RefBiasGelu(xv, {}));
  };
  testing::ExpectAllNear(dx.ToDoubles(), NumericGrad(loss, x.ToDoubles()), 1e-5,
                         1e-5, "dx");
}

TEST(ActivationTest, BiasGeluForwardAndBackward) {
  // h = 160: whole 16-element chunks (the bf16 blocks then read the bias and
  // bias-gradient partials in their shuffled layout); 129: a tail per row.
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (int64_t h : {129, 160}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dt) << " h=" << h);
      const Shape shape{9, h};
      Tensor x = RandomTensor(shape, dt, 4, -3.0f, 3.0f);
      Tensor b = RandomTensor({h}, dt, 5);
      Tensor y = Tensor::Zeros(shape, dt);
      ASSERT_TRUE(BiasGelu(x, b, &y).ok());
      const double rtol = Rtol(dt, kF32Rtol);
      testing::ExpectAllNear(y.ToDoubles(),
                             RefBiasGelu(x.ToDoubles(), b.ToDoubles()),
                             kF32Atol, rtol, "bias gelu");

      Tensor dy = RandomTensor(shape, dt, 6);
      Tensor dx = Tensor::Zeros(shape, dt);
      Tensor db = RandomTensor({h}, DType::kFloat32, 7);
      const std::vector<double> db0 = db.ToDoubles(), dyv = dy.ToDoubles(),
                                xv = x.ToDoubles(), bv = b.ToDoubles();
      ASSERT_TRUE(BiasGeluBackward(dy, x, b, &dx, &db).ok());
      auto loss_x = [&](const std::vector<double>& v) {
        return testing::Dot(dyv, RefBiasGelu(v, bv));
      };
      auto loss_b = [&](const std::vector<double>& v) {
        return testing::Dot(dyv, RefBiasGelu(xv, v));
      };
      testing::ExpectAllNear(dx.ToDoubles(), NumericGrad(loss_x, xv), 1e-5,
                             Rtol(dt, 1e-5), "dx");
      std::vector<double> want_db = NumericGrad(loss_b, bv);
      for (size_t i = 0; i < want_db.size(); ++i) want_db[i] += db0[i];
      // dbias sums fp32 dx (before any bf16 rounding) over 9 rows.
      testing::ExpectAllNear(db.ToDoubles(), want_db, 1e-5, 1e-5, "dbias");
    }
}

TEST(ActivationTest, SwiGLUForwardAndBackward) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t h : {1, 7, 33}) {
      const Shape xs{5, 2 * h}, ys{5, h};
      Tensor x = RandomTensor(xs, dt, 8, -4.0f, 4.0f);
      Tensor y = Tensor::Zeros(ys, dt);
      ASSERT_TRUE(SwiGLU(x, &y).ok());
      const double rtol = Rtol(dt, kF32Rtol);
      testing::ExpectAllNear(y.ToDoubles(), RefSwiGLU(x.ToDoubles(), h),
                             kF32Atol, rtol, "swiglu");
      Tensor dy = RandomTensor(ys, dt, 9);
      Tensor dx = Tensor::Zeros(xs, dt);
      ASSERT_TRUE(SwiGLUBackward(dy, x, &dx).ok());
      const std::vector<double> dyv = dy.ToDoubles();
      auto loss = [&](const std::vector<double>& v) {
        return testing::Dot(dyv, RefSwiGLU(v, h));
      };
      testing::ExpectAllNear(dx.ToDoubles(), NumericGrad(loss, x.ToDoubles()),
                             1e-5, Rtol(dt, 1e-5), "swiglu dx");
    }
  }
}

TEST(ActivationTest, LargeTensorsUseEveryBlock) {
  // More than one parallel chunk and a ragged last block.
  const Shape shape{3, 40000 + 7};
  Tensor x = RandomTensor(shape, DType::kFloat32, 10, -5.0f, 5.0f);
  Tensor y = Tensor::Zeros(shape, DType::kFloat32);
  ASSERT_TRUE(Gelu(x, &y).ok());
  testing::ExpectAllNear(y.ToDoubles(), RefBiasGelu(x.ToDoubles(), {}),
                         kF32Atol, kF32Rtol, "large gelu");
}

// Inputs far in the tails, where exp(-x) overflows: the sigmoid's
// reciprocal must give 0 or 1, never NaN.
TEST(ActivationTest, ExtremeInputsStayFinite) {
  std::vector<float> v = {-1e5f,  -1e4f, -200.0f, -90.0f, -45.0f, -12.0f,
                          -9.5f,  9.5f,  12.0f,   45.0f,  90.0f,  1e4f,
                          -88.5f, 88.5f, -100.0f, 100.0f};
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor x = Tensor::FromVector(v, {2, n / 2}).value();
  Tensor y = Tensor::Zeros({2, n / 2}, DType::kFloat32);
  ASSERT_TRUE(Gelu(x, &y).ok());
  testing::ExpectAllNear(y.ToDoubles(), RefBiasGelu(x.ToDoubles(), {}),
                         kF32Atol, kF32Rtol, "extreme gelu");
  Tensor dy = Tensor::Full({2, n / 2}, 1.0, DType::kFloat32);
  Tensor dx = Tensor::Zeros({2, n / 2}, DType::kFloat32);
  ASSERT_TRUE(GeluBackward(dy, x, &dx).ok());
  for (double d : dx.ToDoubles()) EXPECT_TRUE(std::isfinite(d)) << d;
  Tensor s = Tensor::Zeros({2, n / 4}, DType::kFloat32);
  ASSERT_TRUE(SwiGLU(x, &s).ok());
  testing::ExpectAllNear(s.ToDoubles(), RefSwiGLU(x.ToDoubles(), n / 4),
                         kF32Atol, kF32Rtol, "extreme swiglu");
}

TEST(ActivationTest, BadInputsNameShapesAndLeaveOutputUntouched) {
  Tensor x = RandomTensor({4, 8}, DType::kFloat32, 1);
  Tensor y = RandomTensor({4, 5}, DType::kFloat32, 2);
  const auto before = Bytes(y);
  absl::Status s = SwiGLU(x, &y);
  EXPECT_NE(s.message().find("x fp32[4, 8] and y fp32[4, 5]"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("[4, 4]"), std::string::npos) << s;
  EXPECT_EQ(Bytes(y), before);
  s = Gelu(x, &y);
  EXPECT_NE(s.message().find("x fp32[4, 8] and y fp32[4, 5]"),
            std::string::npos)
      << s;
  EXPECT_EQ(Bytes(y), before);
  Tensor odd = RandomTensor({4, 7}, DType::kFloat32, 3);
  s = SwiGLU(odd, &y);
  EXPECT_NE(s.message().find("even"), std::string::npos) << s;
  Tensor b = RandomTensor({9}, DType::kFloat32, 4);
  Tensor y8 = RandomTensor({4, 8}, DType::kFloat32, 5);
  const auto before8 = Bytes(y8);
  s = BiasGelu(x, b, &y8);
  EXPECT_NE(s.message().find("x fp32[4, 8] and bias fp32[9]"),
            std::string::npos)
      << s;
  EXPECT_EQ(Bytes(y8), before8);
  Tensor i32 = Tensor::Zeros({4, 8}, DType::kInt32);
  s = Gelu(i32, &y8);
  EXPECT_NE(s.message().find("int32[4, 8]"), std::string::npos) << s;
  Tensor cx = testing::FakeCudaTensor({4, 8}, DType::kFloat32);
  s = Gelu(cx, &cx);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
}

}  // namespace
}  // namespace ops
}  // namespace mcc
