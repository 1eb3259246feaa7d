#include "core/ops/norm.h"

#include <cmath>
#include <vector>

#include "core/ops/nn_test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectClose;
using testing::FromDoubles;
using testing::NumericGrad;
using testing::RandomDoubles;

constexpr double kEps = 1e-5;

// float64 reference forward. beta empty for RMSNorm.
std::vector<double> NormRef(bool layer, const std::vector<double>& x,
                            const std::vector<double>& g,
                            const std::vector<double>& b, int64_t rows,
                            int64_t h, std::vector<double>* mean = nullptr,
                            std::vector<double>* rstd = nullptr) {
  std::vector<double> y(x.size());
  if (mean) mean->assign(rows, 0.0);
  if (rstd) rstd->assign(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0.0;
    if (layer) {
      for (int64_t i = 0; i < h; ++i) m += x[r * h + i];
      m /= h;
    }
    double v = 0.0;
    for (int64_t i = 0; i < h; ++i)
      v += (x[r * h + i] - m) * (x[r * h + i] - m);
    const double rs = 1.0 / std::sqrt(v / h + kEps);
    for (int64_t i = 0; i < h; ++i) {
      y[r * h + i] = (x[r * h + i] - m) * rs * g[i] + (layer ? b[i] : 0.0);
    }
    if (mean) (*mean)[r] = m;
    if (rstd) (*rstd)[r] = rs;
  }
  return y;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

struct NormCase {
  bool layer;
  int64_t rows;
  int64_t hidden;
};

class NormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(NormTest, ForwardAndBackwardMatchFloat64) {
  const NormCase c = GetParam();
  const int64_t rows = c.rows, h = c.hidden;
  const uint32_t seed = static_cast<uint32_t>(rows * 1000 + h);
  const std::vector<double> x = RandomDoubles(rows * h, seed, -2.0, 2.0);
  const std::vector<double> g = RandomDoubles(h, seed + 1, 0.5, 1.5);
  const std::vector<double> b = RandomDoubles(h, seed + 2);
  const std::vector<double> w = RandomDoubles(rows * h, seed + 3);
  // Round inputs to fp32 so the reference sees exactly what the kernel sees.
  Tensor xt = FromDoubles(x, {rows, h}, DType::kFloat32);
  Tensor gt = FromDoubles(g, {h}, DType::kFloat32);
  Tensor bt = FromDoubles(b, {h}, DType::kFloat32);
  Tensor dyt = FromDoubles(w, {rows, h}, DType::kFloat32);
  const std::vector<double> xd = xt.ToDoubles(), gd = gt.ToDoubles(),
                            bd = bt.ToDoubles(), wd = dyt.ToDoubles();

  std::vector<double> mean_ref, rstd_ref;
  const std::vector<double> y_ref =
      NormRef(c.layer, xd, gd, bd, rows, h, &mean_ref, &rstd_ref);
  Tensor y = Tensor::Empty({rows, h}, DType::kFloat32);
  Tensor mean = Tensor::Empty({rows}, DType::kFloat32);
  Tensor rstd = Tensor::Empty({rows}, DType::kFloat32);
  if (c.layer) {
    ASSERT_TRUE(LayerNormForward(xt, gt, bt, kEps, &y, &mean, &rstd).ok());
    ExpectClose(mean.ToDoubles(), mean_ref, 1e-6, 1e-6, "mean");
  } else {
    ASSERT_TRUE(RMSNormForward(xt, gt, kEps, &y, &rstd).ok());
  }
  ExpectClose(y.ToDoubles(), y_ref, 1e-5, 1e-5, "y");
  ExpectClose(rstd.ToDoubles(), rstd_ref, 1e-6, 1e-5, "rstd");

  // Gradients of L = sum(y * w) by central differences in float64.
  auto loss_x = [&](const std::vector<double>& v) {
    return Dot(NormRef(c.layer, v, gd, bd, rows, h), wd);
  };
  auto loss_g = [&](const std::vector<double>& v) {
    return Dot(NormRef(c.layer, xd, v, bd, rows, h), wd);
  };
  auto loss_b = [&](const std::vector<double>& v) {
    return Dot(NormRef(c.layer, xd, gd, v, rows, h), wd);
  };
  const std::vector<double> dx_ref = NumericGrad(xd, loss_x);
  const std::vector<double> dg_ref = NumericGrad(gd, loss_g);

  Tensor dx = Tensor::Full({rows, h}, 7.0, DType::kFloat32);  // overwritten
  Tensor dgamma = Tensor::Full({h}, 0.25, DType::kFloat32);   // accumulated
  Tensor dbeta = Tensor::Full({h}, -0.5, DType::kFloat32);
  if (c.layer) {
    ASSERT_TRUE(
        LayerNormBackward(dyt, xt, gt, mean, rstd, &dx, &dgamma, &dbeta).ok());
    std::vector<double> db_ref = NumericGrad(bd, loss_b);
    for (double& d : db_ref) d += -0.5;
    ExpectClose(dbeta.ToDoubles(), db_ref, 1e-4, 1e-4, "dbeta");
  } else {
    ASSERT_TRUE(RMSNormBackward(dyt, xt, gt, rstd, &dx, &dgamma).ok());
  }
  std::vector<double> dg_acc = dg_ref;
  for (double& d : dg_acc) d += 0.25;
  ExpectClose(dx.ToDoubles(), dx_ref, 1e-4, 1e-4, "dx");
  ExpectClose(dgamma.ToDoubles(), dg_acc, 1e-4, 1e-4, "dgamma");
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, NormTest,
    ::testing::Values(NormCase{true, 5, 1}, NormCase{true, 5, 7},
                      NormCase{true, 4, 33}, NormCase{true, 3, 130},
                      NormCase{true, 70, 16}, NormCase{false, 5, 1},
                      NormCase{false, 5, 7}, NormCase{false, 4, 33},
                      NormCase{false, 3, 130}, NormCase{false, 70, 16}));

// 16-bit activations and parameters, fp32 math: within one rounding of the
// output (bf16 8 significant bits, fp16 11: tolerances 8x tighter).
TEST(Norm16BitTest, MatchesFloat64WithinRounding) {
  const int64_t rows = 9, h = 130;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const double f = dt == DType::kBFloat16 ? 1.0 : 1.0 / 8;
    for (bool layer : {true, false}) {
      Tensor x = testing::RandomTensor({rows, h}, dt, 11, -2, 2);
      Tensor g = testing::RandomTensor({h}, dt, 12, 0.5, 1.5);
      Tensor b = testing::RandomTensor({h}, dt, 13);
      Tensor dy = testing::RandomTensor({rows, h}, dt, 14);
      Tensor y = Tensor::Empty({rows, h}, dt);
      Tensor mean = Tensor::Empty({rows}, DType::kFloat32);
      Tensor rstd = Tensor::Empty({rows}, DType::kFloat32);
      const auto xd = x.ToDoubles(), gd = g.ToDoubles(), bd = b.ToDoubles(),
                 wd = dy.ToDoubles();
      const auto y_ref = NormRef(layer, xd, gd, bd, rows, h);
      if (layer) {
        ASSERT_TRUE(LayerNormForward(x, g, b, kEps, &y, &mean, &rstd).ok());
      } else {
        ASSERT_TRUE(RMSNormForward(x, g, kEps, &y, &rstd).ok());
      }
      // bf16 has 8 significant bits: relative rounding 2^-9.
      ExpectClose(
          y.ToDoubles(), y_ref, 1e-2 * f, 8e-3 * f,
          std::string(layer ? "ln y " : "rms y ") + std::string(DTypeName(dt)));
      Tensor dx = Tensor::Empty({rows, h}, dt);
      Tensor dgamma = Tensor::Zeros({h}, DType::kFloat32);
      auto loss_x = [&](const std::vector<double>& v) {
        return Dot(NormRef(layer, v, gd, bd, rows, h), wd);
      };
      if (layer) {
        ASSERT_TRUE(
            LayerNormBackward(dy, x, g, mean, rstd, &dx, &dgamma, nullptr)
                .ok());
      } else {
        ASSERT_TRUE(RMSNormBackward(dy, x, g, rstd, &dx, &dgamma).ok());
      }
      ExpectClose(dx.ToDoubles(), NumericGrad(xd, loss_x), 2e-2 * f, 1e-2 * f,
                  std::string("dx ") + std::string(DTypeName(dt)));
    }
  }
}

TEST(NormErrorsTest, BadShapesNameBothAndLeaveOutputsAlone) {
  Tensor x = Tensor::Full({4, 8}, 1.0, DType::kFloat32);
  Tensor g = Tensor::Full({7}, 1.0, DType::kFloat32);
  Tensor b = Tensor::Full({8}, 0.0, DType::kFloat32);
  Tensor y = Tensor::Full({4, 8}, 3.0, DType::kFloat32);
  Tensor mean = Tensor::Full({4}, 3.0, DType::kFloat32);
  Tensor rstd = Tensor::Full({4}, 3.0, DType::kFloat32);
  absl::Status s = LayerNormForward(x, g, b, 1e-5f, &y, &mean, &rstd);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[7]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[4, 8]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(y, 3.0));
  EXPECT_TRUE(testing::AllEqual(mean, 3.0));

  Tensor g8 = Tensor::Full({8}, 1.0, DType::kFloat32);
  Tensor y_bad = Tensor::Full({4, 9}, 3.0, DType::kFloat32);
  s = RMSNormForward(x, g8, 1e-5f, &y_bad, &rstd);
  EXPECT_NE(s.message().find("[4, 9]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[4, 8]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(y_bad, 3.0));
  EXPECT_TRUE(testing::AllEqual(rstd, 3.0));

  Tensor rstd_bad = Tensor::Full({5}, 3.0, DType::kFloat32);
  s = RMSNormForward(x, g8, 1e-5f, &y, &rstd_bad);
  EXPECT_NE(s.message().find("[5]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(y, 3.0));

  // Parameter gradients must be fp32.
  Tensor dx = Tensor::Full({4, 8}, 3.0, DType::kFloat32);
  Tensor dg_bf16 = Tensor::Zeros({8}, DType::kBFloat16);
  s = RMSNormBackward(x, x, g8, rstd, &dx, &dg_bf16);
  EXPECT_NE(s.message().find("dgamma"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(dx, 3.0));

  // bf16 and fp16 do not mix in one op.
  Tensor x16 = Tensor::Full({4, 8}, 1.0, DType::kFloat16);
  Tensor dy16 = Tensor::Full({4, 8}, 1.0, DType::kBFloat16);
  Tensor dg = Tensor::Zeros({8}, DType::kFloat32);
  s = RMSNormBackward(dy16, x16, g8, rstd, &dx, &dg);
  EXPECT_NE(s.message().find("bf16 and fp16 cannot be mixed"),
            std::string::npos)
      << s;
  EXPECT_TRUE(testing::AllEqual(dx, 3.0));

  Tensor xi = Tensor::Zeros({4, 8}, DType::kInt32);
  s = RMSNormForward(xi, g8, 1e-5f, &y, &rstd);
  EXPECT_NE(s.message().find("int32"), std::string::npos) << s;
}

TEST(NormTestDevice, MatchesCpuBitForBit) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Tensor x = testing::RandomTensor({5, 3, 40}, dt, 1);
    Tensor dy = testing::RandomTensor({5, 3, 40}, dt, 2);
    Tensor gamma = testing::RandomTensor({40}, dt, 3);
    Tensor beta = testing::RandomTensor({40}, dt, 4);
    Tensor y = Tensor::Zeros({5, 3, 40}, dt);
    Tensor mean = Tensor::Zeros({15}, DType::kFloat32);
    Tensor rstd = Tensor::Zeros({15}, DType::kFloat32);
    auto fwd = testing::ExpectSameOnTestDevice(
        {x, gamma, beta, y, mean, rstd}, [](std::vector<Tensor>& t) {
          return LayerNormForward(t[0], t[1], t[2], 1e-5f, &t[3], &t[4], &t[5]);
        });
    Tensor dgamma = testing::RandomTensor({40}, DType::kFloat32, 5);
    Tensor dbeta = testing::RandomTensor({40}, DType::kFloat32, 6);
    testing::ExpectSameOnTestDevice(
        {dy, x, gamma, fwd[4], fwd[5], y, dgamma, dbeta},
        [](std::vector<Tensor>& t) {
          return LayerNormBackward(t[0], t[1], t[2], t[3], t[4], &t[5], &t[6],
                                   &t[7]);
        });
    auto rms = testing::ExpectSameOnTestDevice(
        {x, gamma, y, rstd}, [](std::vector<Tensor>& t) {
          return RMSNormForward(t[0], t[1], 1e-5f, &t[2], &t[3]);
        });
    testing::ExpectSameOnTestDevice(
        {dy, x, gamma, rms[3], y, dgamma}, [](std::vector<Tensor>& t) {
          return RMSNormBackward(t[0], t[1], t[2], t[3], &t[4], &t[5]);
        });
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
