// A linear layer under FP8 (LayerContext::fp8) against a float64 reference
// that computes the recipe's scales and the FP8 GEMMs from their
// definitions: forward, input gradient and accumulated weight gradient over
// two steps of delayed scaling.
#include "parallel/fp8_linear.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "gtest/gtest.h"
#include "parallel/linear.h"

namespace mcc {
namespace parallel {
namespace {

using Matrix = std::vector<std::vector<double>>;

Matrix Random(int rows, int cols, double scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  Matrix m(rows, std::vector<double>(cols));
  for (auto& row : m) {
    for (double& v : row) v = static_cast<float>(normal(rng));
  }
  return m;
}

Tensor ToTensor(const Matrix& m) {
  std::vector<float> v;
  for (const auto& row : m) v.insert(v.end(), row.begin(), row.end());
  return *Tensor::FromVector(
      v, {static_cast<int64_t>(m.size()), static_cast<int64_t>(m[0].size())});
}

Matrix FromTensor(const Tensor& t) {
  const std::vector<double> v = t.ToDoubles();
  Matrix m(t.size(0), std::vector<double>(t.size(1)));
  for (int64_t i = 0; i < t.size(0); ++i) {
    for (int64_t j = 0; j < t.size(1); ++j) m[i][j] = v[i * t.size(1) + j];
  }
  return m;
}

double AbsMax(const Matrix& m) {
  double a = 0;
  for (const auto& row : m) {
    for (double v : row) a = std::max(a, std::fabs(v));
  }
  return a;
}

// The value x takes cast with `scale` and used: fp8(x * scale) / scale,
// the product rounded to fp32 first (as the cast computes it).
double Cast(double x, double scale, Fp8Format f) {
  return RoundToFp8(static_cast<float>(x) * static_cast<float>(scale), f) /
         scale;
}

// sum_k a[i][k] b[j][k] over cast values (a [m, k], b [n, k]).
Matrix CastProduct(const Matrix& a, double sa, Fp8Format fa, const Matrix& b,
                   double sb, Fp8Format fb) {
  Matrix out(a.size(), std::vector<double>(b.size(), 0.0));
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < b.size(); ++j) {
      for (size_t k = 0; k < a[0].size(); ++k) {
        out[i][j] += Cast(a[i][k], sa, fa) * Cast(b[j][k], sb, fb);
      }
    }
  }
  return out;
}

Matrix Transpose(const Matrix& m) {
  Matrix t(m[0].size(), std::vector<double>(m.size()));
  for (size_t i = 0; i < m.size(); ++i) {
    for (size_t j = 0; j < m[0].size(); ++j) t[j][i] = m[i][j];
  }
  return t;
}

void ExpectNear(const Matrix& got, const Matrix& want, const char* what) {
  double norm = 0;
  for (const auto& row : want) {
    for (double v : row) norm = std::max(norm, std::fabs(v));
  }
  for (size_t i = 0; i < want.size(); ++i) {
    for (size_t j = 0; j < want[0].size(); ++j) {
      ASSERT_NEAR(got[i][j], want[i][j], 1e-5 * norm)
          << what << " " << i << "," << j;
    }
  }
}

TEST(Fp8LinearTest, ColumnLayerMatchesTheRecipeAndTheFp8Gemms) {
  constexpr int kTokens = 6, kIn = 24, kOut = 10;
  LayerContext ctx;
  ctx.fp8 = *MakeFp8Recipe("hybrid", "delayed", /*margin=*/1,
                           /*amax_history_len=*/2, "max");
  LinearOptions options;
  options.bias = false;
  options.weight_init = InitSpec::Normal(0.5f);
  auto layer = ColumnParallelLinear::Create("fc", kIn, kOut, options, ctx);
  ASSERT_TRUE(layer.ok()) << layer.status();
  const Matrix w = FromTensor((*layer)->weight()->value);
  // Step 2's input is 4x larger: delayed scaling still casts it with the
  // history's scale (and saturates), then learns.
  const Matrix xs[2] = {Random(kTokens, kIn, 1.0, 1),
                        Random(kTokens, kIn, 4.0, 2)};
  const Matrix dys[2] = {Random(kTokens, kOut, 1e-4, 3),
                         Random(kTokens, kOut, 3e-4, 4)};
  Matrix dw_want(kOut, std::vector<double>(kIn, 0.0));
  std::vector<double> x_amax, w_amax, g_amax;
  // The recipe by hand: delayed, margin 1, history 2, max; the first cast
  // from its own amax.
  auto scale = [](const std::vector<double>& amaxes, double fp8_max) {
    const size_t t = amaxes.size() - 1;
    double basis = amaxes[t];
    if (t > 0) {
      basis = amaxes[t - 1];
      if (t >= 2) basis = std::max(basis, amaxes[t - 2]);
    }
    return fp8_max / basis / 2.0;
  };
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    x_amax.push_back(AbsMax(xs[step]));
    w_amax.push_back(AbsMax(w));
    g_amax.push_back(AbsMax(dys[step]));
    const double sx = scale(x_amax, 448), sw = scale(w_amax, 448);
    const double sg = scale(g_amax, 57344);
    ColumnParallelLinear::Activations act;
    auto y = (*layer)->Forward(ToTensor(xs[step]), &act);
    ASSERT_TRUE(y.ok()) << y.status();
    auto dx = (*layer)->Backward(ToTensor(dys[step]), act);
    ASSERT_TRUE(dx.ok()) << dx.status();
    const Fp8LinearScaling& s = *(*layer)->fp8();
    EXPECT_NEAR(s.input_scaler().scale(), sx, 1e-6 * sx);
    EXPECT_NEAR(s.weight_scaler().scale(), sw, 1e-6 * sw);
    EXPECT_NEAR(s.grad_scaler().scale(), sg, 1e-6 * sg);
    ExpectNear(
        FromTensor(*y),
        CastProduct(xs[step], sx, Fp8Format::kE4M3, w, sw, Fp8Format::kE4M3),
        "y");
    ExpectNear(FromTensor(*dx),
               CastProduct(dys[step], sg, Fp8Format::kE5M2, Transpose(w), sw,
                           Fp8Format::kE4M3),
               "dx");
    const Matrix dw = CastProduct(Transpose(dys[step]), sg, Fp8Format::kE5M2,
                                  Transpose(xs[step]), sx, Fp8Format::kE4M3);
    for (int i = 0; i < kOut; ++i) {
      for (int j = 0; j < kIn; ++j) dw_want[i][j] += dw[i][j];
    }
    ExpectNear(FromTensor((*layer)->weight()->main_grad), dw_want, "dw");
  }
  // The FP8 result is not the exact product (the test would pass vacuously
  // if the casts did nothing).
  ColumnParallelLinear::Activations act;
  const Matrix y = FromTensor(*(*layer)->Forward(ToTensor(xs[0]), &act));
  double exact = 0;
  for (int k = 0; k < kIn; ++k) exact += xs[0][0][k] * w[0][k];
  EXPECT_GT(std::fabs(y[0][0] - exact), 1e-6);
}

}  // namespace
}  // namespace parallel
}  // namespace mcc
