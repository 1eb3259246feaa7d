// Every CUDA op against a float64 CPU reference on random inputs of odd
// sizes, and every backward against central finite differences of the
// float64 forward. Skips without a CUDA device.
#include "core/ops/cuda/ops.h"

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/ops/cuda/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using ::mcc::cuda::CudaDeviceCount;
using testing::AllClose;
using testing::RandomHost;
using testing::ToCuda;

using Vec = std::vector<double>;

// Tolerances for outputs stored in a dtype.
double Rtol(DType d) { return d == DType::kBFloat16 ? 8e-3 : 2e-5; }
double Atol(DType d) { return d == DType::kBFloat16 ? 2e-3 : 2e-6; }

double GeluRef(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// Central difference of f at x.
double Derivative(const std::function<double(double)>& f, double x,
                  double h = 1e-5) {
  return (f(x + h) - f(x - h)) / (2.0 * h);
}

TEST(CudaOpsTest, GeluForwardBackward) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: GeluForwardBackward skipped";
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Tensor x = RandomHost({37, 2711}, dtype, 1, -6.0f, 6.0f);
    Tensor dy = RandomHost({37, 2711}, dtype, 2);
    absl::StatusOr<Tensor> y = GeluForward(ToCuda(x));
    ASSERT_TRUE(y.ok()) << y.status();
    absl::StatusOr<Tensor> dx = GeluBackward(ToCuda(dy), ToCuda(x));
    ASSERT_TRUE(dx.ok()) << dx.status();
    EXPECT_EQ(y->dtype(), dtype);
    const Vec xs = x.ToDoubles(), dys = dy.ToDoubles();
    Vec y_ref(xs.size()), dx_fd(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      y_ref[i] = GeluRef(xs[i]);
      dx_fd[i] = dys[i] * Derivative(GeluRef, xs[i]);
    }
    EXPECT_TRUE(AllClose(y->ToDoubles(), y_ref, Atol(dtype), Rtol(dtype)))
        << DTypeName(dtype);
    EXPECT_TRUE(
        AllClose(dx->ToDoubles(), dx_fd, Atol(dtype) + 1e-5, Rtol(dtype)))
        << DTypeName(dtype);
  }
}

TEST(CudaOpsTest, BiasAddAndGrad) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: BiasAddAndGrad skipped";
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const int64_t cols = 77;
    Tensor x = RandomHost({11, 97, cols}, dtype, 3);  // 1067 rows, 3-D
    const int64_t r = x.numel() / cols;
    Tensor b = RandomHost({cols}, dtype, 4);
    absl::StatusOr<Tensor> y = BiasAdd(ToCuda(x), ToCuda(b));
    ASSERT_TRUE(y.ok()) << y.status();
    const Vec xs = x.ToDoubles(), bs = b.ToDoubles();
    Vec y_ref(xs.size()), db_ref(cols, 0.0), db_abs(cols, 0.0);
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t c = 0; c < cols; ++c) {
        y_ref[i * cols + c] = xs[i * cols + c] + bs[c];
        db_ref[c] += xs[i * cols + c];
        db_abs[c] += std::fabs(xs[i * cols + c]);
      }
    }
    EXPECT_TRUE(AllClose(y->ToDoubles(), y_ref, Atol(dtype), Rtol(dtype)));
    // The bias gradient of sum(dy . (x + b)) is the column sum of dy.
    absl::StatusOr<Tensor> db = BiasGrad(ToCuda(x));
    ASSERT_TRUE(db.ok()) << db.status();
    EXPECT_EQ(db->dtype(), DType::kFloat32);
    EXPECT_EQ(db->shape(), Shape({cols}));
    const Vec got = db->ToDoubles();
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_NEAR(got[c], db_ref[c], 1e-6 * db_abs[c] + 1e-6) << "column " << c;
    }
  }
}

TEST(CudaOpsTest, AdamWMatchesReference) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: AdamWMatchesReference skipped";
  const int64_t n = 10007;
  AdamWConfig config;
  config.lr = 3e-3f;
  config.weight_decay = 0.1f;
  Tensor p_host = RandomHost({n}, DType::kFloat32, 5);
  Tensor p = ToCuda(p_host);
  Tensor m = Tensor::Zeros({n}, DType::kFloat32, Device::CUDA(0));
  Tensor v = Tensor::Zeros({n}, DType::kFloat32, Device::CUDA(0));
  Tensor p16 = Tensor::Empty({n}, DType::kBFloat16, Device::CUDA(0));
  Vec pr = p_host.ToDoubles(), mr(n, 0.0), vr(n, 0.0);
  for (int64_t step = 1; step <= 4; ++step) {
    Tensor g = RandomHost({n}, DType::kFloat32, 100 + step, -1.0f, 1.0f);
    ASSERT_TRUE(AdamWStep(p, ToCuda(g), m, v, config, step, &p16).ok());
    const Vec gs = g.ToDoubles();
    const double b1 = config.beta1, b2 = config.beta2;
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (int64_t i = 0; i < n; ++i) {
      pr[i] -= config.lr * config.weight_decay * pr[i];
      mr[i] = b1 * mr[i] + (1 - b1) * gs[i];
      vr[i] = b2 * vr[i] + (1 - b2) * gs[i] * gs[i];
      pr[i] -=
          config.lr * (mr[i] / bc1) / (std::sqrt(vr[i] / bc2) + config.eps);
    }
  }
  EXPECT_TRUE(AllClose(p.ToDoubles(), pr, 1e-6, 1e-5));
  EXPECT_TRUE(AllClose(m.ToDoubles(), mr, 1e-7, 1e-5));
  EXPECT_TRUE(AllClose(v.ToDoubles(), vr, 1e-9, 1e-5));
  // The bf16 copy is the fp32 result rounded to nearest even.
  const std::vector<float> pf = p.ToFloats();
  Tensor p16_host = *p16.To(Device::CPU());
  const BFloat16* bits = p16_host.data<BFloat16>();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits[i].bits, FloatToBFloat16(pf[i]).bits) << i;
  }
  // Shape mismatches are errors naming the tensors.
  Tensor g_bad = Tensor::Zeros({n - 1}, DType::kFloat32, Device::CUDA(0));
  const absl::Status bad = AdamWStep(p, g_bad, m, v, config, 5);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("fp32[10006]"), absl::string_view::npos) << bad;
}

TEST(CudaOpsTest, ConvertRoundsToNearestEven) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: ConvertRoundsToNearestEven skipped";
  std::vector<float> values = testing::RandomFloats(4099, 9, -1e4f, 1e4f);
  const float specials[] = {
      0.0f,
      -0.0f,
      1.0f + 1.0f / 256,  // halfway, rounds to even (down)
      1.0f + 3.0f / 256,  // halfway, rounds to even (up)
      std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::quiet_NaN(),
      std::numeric_limits<float>::denorm_min(),
      std::numeric_limits<float>::max(),
      -1e-40f};
  values.insert(values.end(), std::begin(specials), std::end(specials));
  const int64_t n = values.size();
  Tensor x = *Tensor::FromVector(values, {n});
  absl::StatusOr<Tensor> y = Convert(ToCuda(x), DType::kBFloat16);
  ASSERT_TRUE(y.ok()) << y.status();
  Tensor y_host = *y->To(Device::CPU());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(y_host.data<BFloat16>()[i].bits, FloatToBFloat16(values[i]).bits)
        << "value " << values[i];
  }
  absl::StatusOr<Tensor> back = Convert(*y, DType::kFloat32);
  ASSERT_TRUE(back.ok()) << back.status();
  const std::vector<float> got = back->ToFloats();
  for (int64_t i = 0; i < n; ++i) {
    const float want = BFloat16ToFloat(y_host.data<BFloat16>()[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i]));
    } else {
      ASSERT_EQ(got[i], want) << i;
    }
  }
}

// float64 LayerNorm of one row.
Vec LayerNormRow(const double* x, const Vec& g, const Vec& b, int64_t n,
                 double eps, double* mean_out = nullptr,
                 double* rstd_out = nullptr) {
  double mean = 0.0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= n;
  double var = 0.0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= n;
  const double rstd = 1.0 / std::sqrt(var + eps);
  Vec y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * rstd * g[i] + b[i];
  if (mean_out) *mean_out = mean;
  if (rstd_out) *rstd_out = rstd;
  return y;
}

TEST(CudaOpsTest, LayerNormForwardBackward) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: LayerNormForwardBackward skipped";
  const float eps = 1e-5f;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int64_t cols : {37, 1001, 5003}) {
      const int64_t rows = 19;
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " cols ", cols));
      Tensor x = RandomHost({rows, cols}, dtype, 11, -3.0f, 5.0f);
      Tensor g = RandomHost({cols}, DType::kFloat32, 12, 0.5f, 1.5f);
      Tensor b = RandomHost({cols}, DType::kFloat32, 13);
      Tensor dy = RandomHost({rows, cols}, dtype, 14);
      absl::StatusOr<LayerNormOutput> out =
          LayerNormForward(ToCuda(x), ToCuda(g), ToCuda(b), eps);
      ASSERT_TRUE(out.ok()) << out.status();
      absl::StatusOr<LayerNormGrads> grads = LayerNormBackward(
          ToCuda(dy), ToCuda(x), ToCuda(g), out->mean, out->rstd);
      ASSERT_TRUE(grads.ok()) << grads.status();

      const Vec xs = x.ToDoubles(), gs = g.ToDoubles(), bs = b.ToDoubles(),
                dys = dy.ToDoubles();
      Vec y_ref, mean_ref(rows), rstd_ref(rows), dx_ref(rows * cols),
          dg_ref(cols, 0.0), db_ref(cols, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const double* xr = &xs[r * cols];
        Vec yr =
            LayerNormRow(xr, gs, bs, cols, eps, &mean_ref[r], &rstd_ref[r]);
        y_ref.insert(y_ref.end(), yr.begin(), yr.end());
        double m1 = 0.0, m2 = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          const double xhat = (xr[c] - mean_ref[r]) * rstd_ref[r];
          const double dyg = dys[r * cols + c] * gs[c];
          m1 += dyg;
          m2 += dyg * xhat;
          dg_ref[c] += dys[r * cols + c] * xhat;
          db_ref[c] += dys[r * cols + c];
        }
        m1 /= cols;
        m2 /= cols;
        for (int64_t c = 0; c < cols; ++c) {
          const double xhat = (xr[c] - mean_ref[r]) * rstd_ref[r];
          dx_ref[r * cols + c] =
              rstd_ref[r] * (dys[r * cols + c] * gs[c] - m1 - xhat * m2);
        }
      }
      // Outputs are stored in dtype; statistics are fp32 from dtype inputs.
      EXPECT_TRUE(
          AllClose(out->y.ToDoubles(), y_ref, 4 * Atol(dtype), Rtol(dtype)));
      EXPECT_TRUE(AllClose(out->mean.ToDoubles(), mean_ref, 1e-5, 1e-5));
      EXPECT_TRUE(AllClose(out->rstd.ToDoubles(), rstd_ref, 1e-5, 1e-4));
      EXPECT_TRUE(AllClose(grads->dx.ToDoubles(), dx_ref,
                           4 * Atol(dtype) + 1e-5, Rtol(dtype) + 1e-4));
      EXPECT_TRUE(AllClose(grads->dgamma.ToDoubles(), dg_ref, 1e-4, 1e-4));
      EXPECT_TRUE(AllClose(grads->dbeta.ToDoubles(), db_ref, 1e-4, 1e-4));
    }
  }
}

TEST(CudaOpsTest, LayerNormBackwardMatchesFiniteDifferences) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP()
        << "no CUDA device: LayerNormBackwardMatchesFiniteDifferences skipped";
  const int64_t rows = 3, cols = 17;
  const double eps = 1e-5;
  Tensor x = RandomHost({rows, cols}, DType::kFloat32, 21);
  Tensor g = RandomHost({cols}, DType::kFloat32, 22, 0.5f, 1.5f);
  Tensor b = RandomHost({cols}, DType::kFloat32, 23);
  Tensor dy = RandomHost({rows, cols}, DType::kFloat32, 24);
  absl::StatusOr<LayerNormOutput> out = LayerNormForward(
      ToCuda(x), ToCuda(g), ToCuda(b), static_cast<float>(eps));
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<LayerNormGrads> grads =
      LayerNormBackward(ToCuda(dy), ToCuda(x), ToCuda(g), out->mean, out->rstd);
  ASSERT_TRUE(grads.ok()) << grads.status();
  Vec xs = x.ToDoubles(), gs = g.ToDoubles(), bs = b.ToDoubles();
  const Vec dys = dy.ToDoubles();
  // L = sum(dy . LayerNorm(x)); its gradients by central differences.
  auto loss = [&]() {
    double l = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const Vec y = LayerNormRow(&xs[r * cols], gs, bs, cols, eps);
      for (int64_t c = 0; c < cols; ++c) l += dys[r * cols + c] * y[c];
    }
    return l;
  };
  auto fd = [&](Vec& param) {
    Vec grad(param.size());
    for (size_t i = 0; i < param.size(); ++i) {
      const double saved = param[i];
      param[i] = saved + 1e-5;
      const double up = loss();
      param[i] = saved - 1e-5;
      const double down = loss();
      param[i] = saved;
      grad[i] = (up - down) / 2e-5;
    }
    return grad;
  };
  EXPECT_TRUE(AllClose(grads->dx.ToDoubles(), fd(xs), 1e-4, 1e-3));
  EXPECT_TRUE(AllClose(grads->dgamma.ToDoubles(), fd(gs), 1e-4, 1e-3));
  EXPECT_TRUE(AllClose(grads->dbeta.ToDoubles(), fd(bs), 1e-4, 1e-3));
}

// float64 cross-entropy of one row; lse returned through the pointer.
double CrossEntropyRow(const double* z, int64_t vocab, int64_t label,
                       double* lse) {
  double mx = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, z[j]);
  double s = 0.0;
  for (int64_t j = 0; j < vocab; ++j) s += std::exp(z[j] - mx);
  *lse = mx + std::log(s);
  return *lse - z[label];
}

TEST(CudaOpsTest, CrossEntropyForwardBackward) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: CrossEntropyForwardBackward skipped";
  const int64_t ignore = -100;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int64_t vocab : {11, 5003, 50257}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " vocab ", vocab));
      const int64_t rows = 23;
      Tensor z = RandomHost({rows, vocab}, dtype, 31, -8.0f, 8.0f);
      std::vector<int64_t> labels(rows);
      std::mt19937 gen(32);
      for (int64_t r = 0; r < rows; ++r) {
        labels[r] = r % 5 == 2 ? ignore : static_cast<int64_t>(gen() % vocab);
      }
      Tensor lab = *Tensor::FromInts(labels, {rows});
      Tensor dloss = RandomHost({rows}, DType::kFloat32, 33);
      absl::StatusOr<CrossEntropyOutput> out =
          SoftmaxCrossEntropyForward(ToCuda(z), ToCuda(lab), ignore);
      ASSERT_TRUE(out.ok()) << out.status();
      absl::StatusOr<Tensor> dz = SoftmaxCrossEntropyBackward(
          ToCuda(dloss), ToCuda(z), ToCuda(lab), out->lse, ignore);
      ASSERT_TRUE(dz.ok()) << dz.status();
      const Vec zs = z.ToDoubles(), dl = dloss.ToDoubles();
      Vec loss_ref(rows), dz_ref(rows * vocab, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        double lse = 0.0;
        const double l = CrossEntropyRow(
            &zs[r * vocab], vocab, labels[r] == ignore ? 0 : labels[r], &lse);
        loss_ref[r] = labels[r] == ignore ? 0.0 : l;
        if (labels[r] == ignore) continue;
        for (int64_t j = 0; j < vocab; ++j) {
          dz_ref[r * vocab + j] = dl[r] * (std::exp(zs[r * vocab + j] - lse) -
                                           (j == labels[r] ? 1 : 0));
        }
      }
      EXPECT_TRUE(AllClose(out->loss.ToDoubles(), loss_ref, 2e-5, 2e-5));
      EXPECT_TRUE(AllClose(dz->ToDoubles(), dz_ref, Atol(dtype) * 0.1 + 1e-6,
                           Rtol(dtype) + 1e-4));
    }
  }
}

TEST(CudaOpsTest, CrossEntropyBackwardMatchesFiniteDifferences) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: "
                    "CrossEntropyBackwardMatchesFiniteDifferences skipped";
  const int64_t rows = 4, vocab = 13, ignore = -1;
  Tensor z = RandomHost({rows, vocab}, DType::kFloat32, 41, -3.0f, 3.0f);
  const std::vector<int64_t> labels = {3, ignore, 12, 0};
  Tensor lab = *Tensor::FromInts(labels, {rows});
  Tensor dloss = RandomHost({rows}, DType::kFloat32, 42);
  absl::StatusOr<CrossEntropyOutput> out =
      SoftmaxCrossEntropyForward(ToCuda(z), ToCuda(lab), ignore);
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<Tensor> dz = SoftmaxCrossEntropyBackward(
      ToCuda(dloss), ToCuda(z), ToCuda(lab), out->lse, ignore);
  ASSERT_TRUE(dz.ok()) << dz.status();
  Vec zs = z.ToDoubles();
  const Vec dl = dloss.ToDoubles();
  auto loss = [&]() {
    double l = 0.0, lse = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      if (labels[r] == ignore) continue;
      l += dl[r] * CrossEntropyRow(&zs[r * vocab], vocab, labels[r], &lse);
    }
    return l;
  };
  Vec fd(zs.size());
  for (size_t i = 0; i < zs.size(); ++i) {
    const double saved = zs[i];
    zs[i] = saved + 1e-5;
    const double up = loss();
    zs[i] = saved - 1e-5;
    const double down = loss();
    zs[i] = saved;
    fd[i] = (up - down) / 2e-5;
  }
  EXPECT_TRUE(AllClose(dz->ToDoubles(), fd, 1e-5, 1e-3));
  // An out-of-range label (not the ignore index) gives a NaN loss.
  Tensor bad = *Tensor::FromInts({3, vocab, 0, 1}, {rows});
  absl::StatusOr<CrossEntropyOutput> nan_out =
      SoftmaxCrossEntropyForward(ToCuda(z), ToCuda(bad), ignore);
  ASSERT_TRUE(nan_out.ok());
  EXPECT_TRUE(std::isnan(nan_out->loss.ToDoubles()[1]));
  EXPECT_FALSE(std::isnan(nan_out->loss.ToDoubles()[0]));
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
