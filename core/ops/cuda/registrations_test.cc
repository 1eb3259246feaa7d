// Every CUDA kernel registered by //core/ops/cuda:registrations against the
// CPU kernel of the same slot, run through the same op on the same random
// inputs (odd sizes, every dtype mix the op takes), within an error bound
// derived below for each op. Skips without a CUDA device (the
// *_on_test_device build runs them in CI; see test_util.h).
//
// Bounds: u = 2^-24 is fp32's unit roundoff. A sum of n fp32 terms in any
// order is within (n - 1) u sum|terms| of the exact sum, so two kernels
// that sum in different orders differ by at most 2 n u sum|terms|. The CPU
// kernels' own bounds are those their headers and tests state (GELU's
// 1 / (1 + 2^t) 2.71e-6 relative, Exp8 about 2 ulp); CUDA's tanhf, expf and
// logf are within 2 ulp, and / and sqrtf are correctly rounded (nvcc's
// defaults). A 16-bit output adds one ulp of its type at the larger of the
// two values (each side rounds its fp32 value once). Ops whose kernels
// round identically (Fill, Convert, Scale, Add, Accumulate, BiasAdd) are
// compared bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/activation.h"
#include "core/ops/adamw.h"
#include "core/ops/bias.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/cuda/test_util.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/layout.h"
#include "core/ops/loss_sum.h"
#include "core/ops/multi_tensor.h"
#include "core/ops/norm.h"
#include "core/ops/reduce.h"
#include "core/ops/rotary.h"
#include "core/ops/sgd.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using testing::CudaTest;
using testing::KernelDevice;
using testing::kU32;
using testing::RandomHost;
using testing::SameBytes;
using testing::ToCuda;
using testing::Values;
using testing::WithinBound;

constexpr double kU = kU32;
const DType kF32 = DType::kFloat32, kBF16 = DType::kBFloat16,
            kF16 = DType::kFloat16;

std::string Name(DType t) { return std::string(DTypeName(t)); }

// The spacing of dtype's values in |v|'s binade, not below the subnormal
// spacing.
double Ulp(DType dt, double v) {
  const int digits = dt == kBF16 ? 8 : dt == kF16 ? 11 : 24;
  const int emin = dt == kF16 ? -14 : -126;
  const int e = v == 0 ? emin : std::max(std::ilogb(v), emin);
  return std::ldexp(1.0, e - (digits - 1));
}

// The bound for outputs of dtype dt whose fp32 values (before rounding)
// differ by at most delta: delta, plus for a 16-bit output one ulp at the
// larger value (each side rounds once to nearest).
std::vector<double> OutBound(DType dt, const std::vector<double>& want,
                             std::vector<double> delta) {
  for (size_t i = 0; i < delta.size(); ++i) {
    if (dt != kF32) delta[i] += Ulp(dt, std::fabs(want[i]) + delta[i]);
  }
  return delta;
}

Tensor EmptyLike(const Tensor& t, DType dtype, Device device) {
  return Tensor::Empty(t.shape(), dtype, device);
}

// A copy of a host tensor on the host and one on the device.
struct Pair {
  Tensor host, dev;
};
Pair Both(const Tensor& host) { return {host.Clone(), ToCuda(host)}; }

class CudaKernelTest : public CudaTest {};

// ---- GELU -------------------------------------------------------------------

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;

struct DTypeMix {
  DType in, out;
};
const DTypeMix kUnaryMixes[] = {{kF32, kF32},  {kBF16, kBF16}, {kF16, kF16},
                                {kBF16, kF32}, {kF32, kBF16},  {kF16, kF32}};

// fp32 error of gelu(x) on each side. CPU (activation.cc): 1 / (1 + 2^t)
// to 2.71e-6 (7.54e-5 for a bf16 output) plus ln(2) 8u |t| from t's error,
// plus two roundings. CUDA: 0.5 x (1 + tanh(a)), a = sqrt(2/pi)(x + k x^3)
// to 4u relative, tanhf to 2 ulp (<= 2u absolute, |tanh| < 1) plus (1 -
// tanh^2) 4u |a| from a's error, then 1 + tanh and the product round once
// each.
double GeluDelta(double x, DType out) {
  const double a = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  const double th = std::tanh(a);
  const double y = 0.5 * x * (1.0 + th);
  const double t = 2.0 * a / std::log(2.0);
  const double cpu =
      std::fabs(y) * ((out == kBF16 ? 7.54e-5 : 2.71e-6) +
                      std::log(2.0) * 8 * kU * std::fabs(t) + 3 * kU);
  const double gpu =
      0.5 * std::fabs(x) *
          (2 * kU + (1 - th * th) * 4 * kU * std::fabs(a) + kU * (1 + th)) +
      2 * kU * std::fabs(y);
  return cpu + gpu + 1e-30;
}

TEST_F(CudaKernelTest, Gelu) {
  for (const DTypeMix& mix : kUnaryMixes) {
    SCOPED_TRACE(Name(mix.in) + " -> " + Name(mix.out));
    const Tensor xh = RandomHost({37, 129}, mix.in, 1, -6.0f, 6.0f);
    const Tensor xd = ToCuda(xh);
    Tensor yh = EmptyLike(xh, mix.out, Device::CPU());
    Tensor yd = EmptyLike(xh, mix.out, KernelDevice());
    ASSERT_TRUE(Gelu(xh, &yh).ok());
    ASSERT_TRUE(Gelu(xd, &yd).ok());
    const std::vector<double> x = Values(xh), want = Values(yh);
    std::vector<double> delta(x.size());
    for (size_t i = 0; i < x.size(); ++i) delta[i] = GeluDelta(x[i], mix.out);
    EXPECT_TRUE(WithinBound(Values(yd), want, OutBound(mix.out, want, delta)));
    if (mix.in == mix.out) {  // In place: the same values.
      Tensor inplace = xd.Clone();
      ASSERT_TRUE(Gelu(inplace, &inplace).ok());
      EXPECT_TRUE(SameBytes(inplace, yd));
    }
  }
}

// gelu'(x) = 0.5 (1 + th) + 0.5 x (1 - th^2) c (1 + 3 k x^2), th = tanh(a).
// CPU: each of its two terms to about the sigmoid's relative error (2.71e-6
// + ln(2) 8u |t|, twice for the second, as activation_test derives), plus
// 8 roundings. CUDA: th off by 2u + (1 - th^2) 4u |a| moves gelu' by
// |d gelu'/d th| = |0.5 - x th c (1 + 3 k x^2)| times that, plus 8 roundings
// of each term. dx = dy gelu' rounds once more.
double GeluGradDelta(double x, double dy) {
  const double a = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  const double th = std::tanh(a);
  const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCoeff * x * x);
  const double s = std::fabs(0.5 * (1 + th));
  const double w = std::fabs(0.5 * x * (1 - th * th) * du);
  const double t = 2.0 * a / std::log(2.0);
  const double rho = 2.71e-6 + std::log(2.0) * 8 * kU * std::fabs(t);
  const double cpu = s * rho + w * 2 * rho + 8 * kU * (s + w);
  const double dth = 2 * kU + (1 - th * th) * 4 * kU * std::fabs(a);
  const double gpu = std::fabs(0.5 - x * th * du) * dth + 8 * kU * (s + w);
  return std::fabs(dy) * (cpu + gpu + kU * (s + w)) + 1e-30;
}

TEST_F(CudaKernelTest, GeluBackward) {
  for (const DTypeMix& mix : kUnaryMixes) {
    SCOPED_TRACE(Name(mix.in) + " -> " + Name(mix.out));
    const Tensor xh = RandomHost({1031}, mix.in, 2, -6.0f, 6.0f);
    const Tensor dyh = RandomHost({1031}, mix.in, 3);
    Tensor dxh = EmptyLike(xh, mix.out, Device::CPU());
    Tensor dxd = EmptyLike(xh, mix.out, KernelDevice());
    ASSERT_TRUE(GeluBackward(dyh, xh, &dxh).ok());
    ASSERT_TRUE(GeluBackward(ToCuda(dyh), ToCuda(xh), &dxd).ok());
    const std::vector<double> x = Values(xh), dy = Values(dyh),
                              want = Values(dxh);
    std::vector<double> delta(x.size());
    for (size_t i = 0; i < x.size(); ++i) delta[i] = GeluGradDelta(x[i], dy[i]);
    EXPECT_TRUE(WithinBound(Values(dxd), want, OutBound(mix.out, want, delta)));
  }
}

// x + bias rounds once in fp32, identically on both sides, so BiasGelu's
// bound is Gelu's at v = float(x + bias).
TEST_F(CudaKernelTest, BiasGelu) {
  for (const DTypeMix& mix : kUnaryMixes) {
    SCOPED_TRACE(Name(mix.in) + " -> " + Name(mix.out));
    const Tensor xh = RandomHost({23, 65}, mix.in, 30, -5.0f, 5.0f);
    const Tensor bh = RandomHost({65}, mix.in, 31);
    Tensor yh = EmptyLike(xh, mix.out, Device::CPU());
    Tensor yd = EmptyLike(xh, mix.out, KernelDevice());
    ASSERT_TRUE(BiasGelu(xh, bh, &yh).ok());
    ASSERT_TRUE(BiasGelu(ToCuda(xh), ToCuda(bh), &yd).ok());
    const std::vector<double> x = Values(xh), b = Values(bh), want = Values(yh);
    std::vector<double> delta(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = static_cast<float>(x[i]) + static_cast<float>(b[i % 65]);
      delta[i] = GeluDelta(v, mix.out);
    }
    EXPECT_TRUE(WithinBound(Values(yd), want, OutBound(mix.out, want, delta)));
  }
}

// dx as GeluBackward's at v = float(x + bias); dbias += the column sums of
// the unrounded dx: each term within GeluGradDelta, the two summation
// orders 2 (rows + 1) u sum|dx|, and the final additions 2u (|old| + |sum|).
TEST_F(CudaKernelTest, BiasGeluBackward) {
  const int64_t rows = 71, h = 40;
  for (const DTypeMix& mix : kUnaryMixes) {
    SCOPED_TRACE(Name(mix.in) + " -> " + Name(mix.out));
    const Tensor xh = RandomHost({rows, h}, mix.in, 32, -5.0f, 5.0f);
    const Tensor bh = RandomHost({h}, mix.in, 33);
    const Tensor dyh = RandomHost({rows, h}, mix.in, 34);
    Tensor dxh = EmptyLike(xh, mix.out, Device::CPU());
    Tensor dxd = EmptyLike(xh, mix.out, KernelDevice());
    Pair db = Both(RandomHost({h}, kF32, 35));  // Accumulated into.
    const std::vector<double> db0 = Values(db.host);
    ASSERT_TRUE(BiasGeluBackward(dyh, xh, bh, &dxh, &db.host).ok());
    ASSERT_TRUE(
        BiasGeluBackward(ToCuda(dyh), ToCuda(xh), ToCuda(bh), &dxd, &db.dev)
            .ok());
    const std::vector<double> x = Values(xh), b = Values(bh), dy = Values(dyh),
                              want = Values(dxh);
    std::vector<double> delta(x.size()), sum(h, 0), abs_sum(h, 0),
        delta_sum(h, 0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < h; ++c) {
        const int64_t i = r * h + c;
        const float v = static_cast<float>(x[i]) + static_cast<float>(b[c]);
        delta[i] = GeluGradDelta(v, dy[i]);
        const double a = kSqrt2OverPi * (v + kGeluCoeff * v * v * v);
        const double th = std::tanh(a);
        const double g = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) *
                                              kSqrt2OverPi *
                                              (1 + 3 * kGeluCoeff * v * v);
        sum[c] += dy[i] * g;
        abs_sum[c] += std::fabs(dy[i] * g);
        delta_sum[c] += delta[i];
      }
    }
    EXPECT_TRUE(WithinBound(Values(dxd), want, OutBound(mix.out, want, delta)));
    std::vector<double> bound(h);
    for (int64_t c = 0; c < h; ++c) {
      bound[c] = delta_sum[c] + 2 * (rows + 1) * kU * abs_sum[c] +
                 2 * kU * (std::fabs(db0[c]) + std::fabs(sum[c]));
    }
    const std::vector<double> want_db = Values(db.host);
    for (int64_t c = 0; c < h; ++c) {
      // Accumulated, not overwritten.
      ASSERT_NEAR(want_db[c], db0[c] + sum[c], bound[c] + 1e-5);
    }
    EXPECT_TRUE(WithinBound(Values(db.dev), want_db, bound));
  }
}

// sigmoid(a) = 1 / (1 + e), e = exp(-a). CPU (activation.cc): to 2.71e-6
// (7.54e-5 for a bf16 output) plus ln(2) 2u |t| with t = -log2(e) a, plus
// the reciprocal's and 1 + 2^t's roundings; CUDA: expf to 2 ulp, 1 + e and
// the division one rounding each, 4u. rho below is their sum; silu(a) b
// adds two roundings each side.
double SigmoidRho(double a, DType out) {
  return (out == kBF16 ? 7.54e-5 : 2.71e-6) + 2 * kU * std::fabs(a) + 3 * kU +
         4 * kU;
}

TEST_F(CudaKernelTest, SwiGLU) {
  const int64_t rows = 19, h = 53;
  for (const DTypeMix& mix : kUnaryMixes) {
    SCOPED_TRACE(Name(mix.in) + " -> " + Name(mix.out));
    const Tensor xh = RandomHost({rows, 2 * h}, mix.in, 36, -6.0f, 6.0f);
    Tensor yh = Tensor::Empty({rows, h}, mix.out);
    Tensor yd = Tensor::Empty({rows, h}, mix.out, KernelDevice());
    ASSERT_TRUE(SwiGLU(xh, &yh).ok());
    ASSERT_TRUE(SwiGLU(ToCuda(xh), &yd).ok());
    const std::vector<double> x = Values(xh), want = Values(yh);
    std::vector<double> delta(want.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < h; ++c) {
        const double a = x[r * 2 * h + c], b = x[r * 2 * h + h + c];
        const double y = a / (1 + std::exp(-a)) * b;
        delta[r * h + c] =
            std::fabs(y) * (SigmoidRho(a, mix.out) + 4 * kU) + 1e-30;
      }
    }
    EXPECT_TRUE(WithinBound(Values(yd), want, OutBound(mix.out, want, delta)));
  }
}

// da = g b s (1 + a (1 - s)), db = g a s: s and 1 - s (computed as e s on
// both sides, no cancellation) each within rho relative; 1 + a (1 - s) may
// cancel, so its error is bounded absolutely by |a| (1 - s) (rho + 2u) +
// u; six roundings of the products.
TEST_F(CudaKernelTest, SwiGLUBackward) {
  const int64_t rows = 17, h = 61;
  for (const DTypeMix& mix : kUnaryMixes) {
    SCOPED_TRACE(Name(mix.in) + " -> " + Name(mix.out));
    const Tensor xh = RandomHost({rows, 2 * h}, mix.in, 37, -6.0f, 6.0f);
    const Tensor dyh = RandomHost({rows, h}, mix.in, 38);
    Tensor dxh = Tensor::Empty({rows, 2 * h}, mix.out);
    Tensor dxd = Tensor::Empty({rows, 2 * h}, mix.out, KernelDevice());
    ASSERT_TRUE(SwiGLUBackward(dyh, xh, &dxh).ok());
    ASSERT_TRUE(SwiGLUBackward(ToCuda(dyh), ToCuda(xh), &dxd).ok());
    const std::vector<double> x = Values(xh), dy = Values(dyh),
                              want = Values(dxh);
    std::vector<double> delta(want.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < h; ++c) {
        const double a = x[r * 2 * h + c], b = x[r * 2 * h + h + c];
        const double g = dy[r * h + c];
        const double s = 1 / (1 + std::exp(-a)), oms = 1 - s;
        const double rho = SigmoidRho(a, kF32);
        const double inner = 1 + a * oms;
        const double d_inner = std::fabs(a) * oms * (rho + 2 * kU) + kU;
        delta[r * 2 * h + c] =
            std::fabs(g * b) * s *
                (rho * std::fabs(inner) + d_inner + 6 * kU * std::fabs(inner)) +
            1e-30;
        delta[r * 2 * h + h + c] =
            std::fabs(g * a) * s * (rho + 4 * kU) + 1e-30;
      }
    }
    EXPECT_TRUE(WithinBound(Values(dxd), want, OutBound(mix.out, want, delta)));
  }
}

// ---- Bias -------------------------------------------------------------------

// One fp32 addition rounded once to y's dtype, on both sides: bit for bit.
TEST_F(CudaKernelTest, BiasAddIsExact) {
  for (const DTypeMix& mix : kUnaryMixes) {
    for (DType bias_type : {kF32, kBF16}) {
      SCOPED_TRACE(Name(mix.in) + " -> " + Name(mix.out) + ", bias " +
                   Name(bias_type));
      const Tensor xh = RandomHost({3, 5, 77}, mix.in, 4);
      const Tensor bh = RandomHost({77}, bias_type, 5);
      Tensor yh = EmptyLike(xh, mix.out, Device::CPU());
      Tensor yd = EmptyLike(xh, mix.out, KernelDevice());
      ASSERT_TRUE(BiasAdd(xh, bh, &yh).ok());
      ASSERT_TRUE(BiasAdd(ToCuda(xh), ToCuda(bh), &yd).ok());
      EXPECT_TRUE(SameBytes(yd, yh));
    }
  }
}

// dbias += column sums: 2 rows u sum|dy| for the two summation orders
// (the CPU's fp32 partials over 64 rows, then float64), plus the final
// additions to dbias, one rounding each side.
TEST_F(CudaKernelTest, BiasAddBackwardAccumulates) {
  for (DType dt : {kF32, kBF16, kF16}) {
    SCOPED_TRACE(Name(dt));
    const int64_t rows = 203, h = 67;
    const Tensor dyh = RandomHost({rows, h}, dt, 6);
    Pair db = Both(RandomHost({h}, kF32, 7));  // Accumulated into.
    const std::vector<double> before = Values(db.host);
    ASSERT_TRUE(BiasAddBackward(dyh, &db.host).ok());
    ASSERT_TRUE(BiasAddBackward(ToCuda(dyh), &db.dev).ok());
    const std::vector<double> dy = Values(dyh), want = Values(db.host);
    std::vector<double> bound(h);
    for (int64_t c = 0; c < h; ++c) {
      double abs_sum = 0, sum = 0;
      for (int64_t r = 0; r < rows; ++r) {
        abs_sum += std::fabs(dy[r * h + c]);
        sum += dy[r * h + c];
      }
      bound[c] = 2 * rows * kU * abs_sum +
                 2 * kU * (std::fabs(before[c]) + std::fabs(sum));
      // Accumulated, not overwritten: want holds the old value.
      ASSERT_NEAR(want[c], before[c] + sum, bound[c]);
    }
    EXPECT_TRUE(WithinBound(Values(db.dev), want, bound));
  }
}

// ---- AdamW ------------------------------------------------------------------

// One step from random state (step 7: bias corrections active), weight decay
// and a grad scale. Each side rounds every operation once, the CPU perhaps
// contracting products into FMAs (one rounding fewer), so per output the
// sides differ by a few u times the magnitudes of the terms: m by 4u
// (|beta1 m| + |(1 - beta1) g|), v by 6u (|beta2 v| + |(1 - beta2) g^2|),
// and the parameter by 4u |p decay| + 8u |update| plus the update's
// sensitivity to m's and v's differences (lr' dm / denom, |update| dv /
// (2 v)).
TEST_F(CudaKernelTest, AdamWStep) {
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.beta1 = 0.9f;
  cfg.beta2 = 0.95f;
  cfg.eps = 1e-8f;
  cfg.weight_decay = 0.1f;
  cfg.step = 7;
  cfg.grad_scale = 0.5f;
  const Shape shape = {1001};
  for (DType grad_type : {kF32, kBF16, kF16}) {
    for (DType copy_type : {kF32, kBF16, kF16}) {  // kF32: no 16-bit copy.
      SCOPED_TRACE("grad " + Name(grad_type) + ", copy " + Name(copy_type));
      const Tensor gh = RandomHost(shape, grad_type, 8);
      Pair p = Both(RandomHost(shape, kF32, 9));
      Pair m = Both(RandomHost(shape, kF32, 10, -0.5f, 0.5f));
      Pair v = Both(RandomHost(shape, kF32, 11, 0.0f, 0.5f));
      const std::vector<double> p0 = Values(p.host), m0 = Values(m.host),
                                v0 = Values(v.host), g = Values(gh);
      const bool copy = copy_type != kF32;
      Pair p16{
          copy ? Tensor::Empty(shape, copy_type) : Tensor(),
          copy ? Tensor::Empty(shape, copy_type, KernelDevice()) : Tensor()};
      ASSERT_TRUE(AdamWStep(cfg, gh, &p.host, &m.host, &v.host,
                            copy ? &p16.host : nullptr)
                      .ok());
      ASSERT_TRUE(AdamWStep(cfg, ToCuda(gh), &p.dev, &m.dev, &v.dev,
                            copy ? &p16.dev : nullptr)
                      .ok());
      const std::vector<double> m1 = Values(m.host), v1 = Values(v.host),
                                p1 = Values(p.host);
      const double b1 = cfg.beta1, b2 = cfg.beta2;
      const double step_size = cfg.lr / (1 - std::pow(b1, cfg.step));
      const double bc2 = 1 - std::pow(b2, cfg.step);
      const double decay = 1 - double{cfg.lr} * cfg.weight_decay;
      std::vector<double> bm(p0.size()), bv(p0.size()), bp(p0.size());
      for (size_t i = 0; i < p0.size(); ++i) {
        const double gi = g[i] * cfg.grad_scale;
        bm[i] = 4 * kU * (std::fabs(b1 * m0[i]) + std::fabs((1 - b1) * gi));
        bv[i] =
            6 * kU * (std::fabs(b2 * v0[i]) + std::fabs((1 - b2) * gi * gi));
        const double denom = std::sqrt(v1[i] / bc2) + cfg.eps;
        const double update = step_size * m1[i] / denom;
        bp[i] = 4 * kU * std::fabs(p0[i] * decay) + 8 * kU * std::fabs(update) +
                step_size * bm[i] / denom +
                std::fabs(update) * bv[i] / (2 * std::max(v1[i], 1e-30));
      }
      EXPECT_TRUE(WithinBound(Values(m.dev), m1, bm));
      EXPECT_TRUE(WithinBound(Values(v.dev), v1, bv));
      EXPECT_TRUE(WithinBound(Values(p.dev), p1, bp));
      if (copy) {
        const std::vector<double> want16 = Values(p16.host);
        EXPECT_TRUE(WithinBound(Values(p16.dev), want16,
                                OutBound(copy_type, want16, bp)));
      }
    }
  }
}

// Each side rounds every operation of sgd.h's formulas once, either perhaps
// contracting a product and a sum into an FMA (one rounding fewer): d off by
// 2u (|g gs| + |wd p|), the buffer by 2u (|m buf| + |d|) plus m times d's
// difference, the nesterov d by 2u (|d| + |m buf|) plus both differences,
// and param by 2u (|p| + |lr d|) plus lr times d's difference.
TEST_F(CudaKernelTest, SgdStep) {
  const Shape shape = {777};
  for (bool nesterov : {false, true}) {
    for (bool first : {false, true}) {
      for (DType gt : {kF32, kBF16}) {
        SCOPED_TRACE(absl::StrCat(nesterov ? "nesterov " : "",
                                  first ? "first " : "", Name(gt)));
        SgdConfig cfg;
        cfg.lr = 0.05f;
        cfg.momentum = 0.9f;
        cfg.nesterov = nesterov;
        cfg.weight_decay = 0.01f;
        cfg.grad_scale = 0.5f;
        cfg.first_step = first;
        const Tensor g = RandomHost(shape, gt, 70);
        Pair p = Both(RandomHost(shape, kF32, 71));
        Pair buf = Both(RandomHost(shape, kF32, 72));
        const std::vector<double> g0 = Values(g), p0 = Values(p.host),
                                  b0 = Values(buf.host);
        ASSERT_TRUE(SgdStep(cfg, g, &p.host, &buf.host).ok());
        ASSERT_TRUE(SgdStep(cfg, ToCuda(g), &p.dev, &buf.dev).ok());
        std::vector<double> bp(p0.size()), bb(p0.size());
        const double m = cfg.momentum;
        for (size_t i = 0; i < p0.size(); ++i) {
          const double d = g0[i] * cfg.grad_scale + cfg.weight_decay * p0[i];
          const double dd = 2 * kU *
                            (std::fabs(g0[i] * cfg.grad_scale) +
                             std::fabs(cfg.weight_decay * p0[i]));
          const double b = first ? d : m * b0[i] + d;
          bb[i] =
              first ? dd : 2 * kU * (std::fabs(m * b0[i]) + std::fabs(d)) + dd;
          const double d2 = nesterov ? d + m * b : b;
          const double dd2 =
              nesterov
                  ? 2 * kU * (std::fabs(d) + std::fabs(m * b)) + dd + m * bb[i]
                  : bb[i];
          bp[i] = 2 * kU * (std::fabs(p0[i]) + std::fabs(cfg.lr * d2)) +
                  cfg.lr * dd2 + 1e-30;
          bb[i] += 1e-30;
        }
        EXPECT_TRUE(WithinBound(Values(buf.dev), Values(buf.host), bb));
        EXPECT_TRUE(WithinBound(Values(p.dev), Values(p.host), bp));
      }
    }
  }
}

// ---- Embedding --------------------------------------------------------------

// The lookup moves (or rounds once) table rows: bit for bit. The backward
// sums each element in token order in fp32 on both sides: bit for bit too,
// with repeated ids, a vocab-parallel shard and ids outside it.
TEST_F(CudaKernelTest, EmbeddingIsExact) {
  const int64_t vocab = 37, hidden = 70, tokens = 301;
  std::vector<int64_t> ids(tokens);
  for (int64_t t = 0; t < tokens; ++t)
    ids[t] = (t * 7 + t / 13) % 50;  // >= 37: outside.
  for (DType it : {DType::kInt32, DType::kInt64}) {
    for (DType tt : {kF32, kBF16}) {
      for (DType ot : {kF32, kBF16}) {
        SCOPED_TRACE(Name(it) + " ids, table " + Name(tt) + ", out " +
                     Name(ot));
        const Tensor id = *Tensor::FromInts(ids, {7, 43}, it);
        const Tensor table = RandomHost({vocab, hidden}, tt, 73);
        EmbeddingShard shard;
        shard.vocab_start = 5;
        shard.mask_outside = true;
        Tensor oh = Tensor::Empty({7, 43, hidden}, ot);
        Tensor od = Tensor::Empty({7, 43, hidden}, ot, KernelDevice());
        ASSERT_TRUE(EmbeddingLookup(id, table, &oh, shard).ok());
        ASSERT_TRUE(
            EmbeddingLookup(ToCuda(id), ToCuda(table), &od, shard).ok());
        EXPECT_TRUE(SameBytes(od, oh)) << "lookup";
        const Tensor dout = RandomHost({7, 43, hidden}, ot, 74);
        Pair dtable = Both(RandomHost({vocab, hidden}, kF32, 75));
        ASSERT_TRUE(EmbeddingBackward(id, dout, &dtable.host, shard).ok());
        ASSERT_TRUE(
            EmbeddingBackward(ToCuda(id), ToCuda(dout), &dtable.dev, shard)
                .ok());
        EXPECT_TRUE(SameBytes(dtable.dev, dtable.host)) << "backward";
      }
    }
  }
}

// ---- Tensor primitives and elementwise ops ---------------------------------

// The same bit pattern, computed on the host from the same conversion.
TEST_F(CudaKernelTest, FillIsExact) {
  for (DType dt :
       {kF32, kBF16, kF16, DType::kInt32, DType::kInt64, DType::kInt8}) {
    // int8 (quantised weights) with values it holds.
    const std::vector<double> values =
        dt == DType::kInt8
            ? std::vector<double>{0.0, -0.0, 1.0, -3.7, 127.0, -128.0}
            : std::vector<double>{0.0, -0.0, 1.0, -3.7, 65519.0, 1e-6};
    for (double value : values) {
      SCOPED_TRACE(absl::StrCat(Name(dt), " ", value));
      Pair t = Both(RandomHost({513}, dt, 12));
      ASSERT_TRUE(Fill(value, &t.host).ok());
      ASSERT_TRUE(Fill(value, &t.dev).ok());
      EXPECT_TRUE(SameBytes(t.dev, t.host));
    }
  }
  // Tensor::Fill and Zeros on the device use the same slot.
  Tensor z = Tensor::Zeros({7}, kBF16, KernelDevice());
  EXPECT_TRUE(SameBytes(z, Tensor::Zeros({7}, kBF16)));
  Tensor f = Tensor::Full({9}, 2.5, DType::kInt64, KernelDevice());
  EXPECT_TRUE(SameBytes(f, Tensor::Full({9}, 2.5, DType::kInt64)));
}

// One rounding to nearest even (or truncation toward zero) per element, on
// both sides, for every pair of dtypes; values within every type's range
// (int8's for a pair with int8: a float outside it has no defined
// conversion on either side).
TEST_F(CudaKernelTest, ConvertIsExact) {
  const DType all[] = {kF32,          kBF16,         kF16,
                       DType::kInt32, DType::kInt64, DType::kInt8};
  for (DType from : all) {
    for (DType to : all) {
      SCOPED_TRACE(Name(from) + " -> " + Name(to));
      const bool int8 = from == DType::kInt8 || to == DType::kInt8;
      const float range = int8 ? 127.0f : 3000.0f;
      const Tensor src = RandomHost({1027}, from, 13, -range, range);
      Tensor dh = Tensor::Empty({1027}, to);
      Tensor dd = Tensor::Empty({1027}, to, KernelDevice());
      ASSERT_TRUE(Convert(src, &dh).ok());
      ASSERT_TRUE(Convert(ToCuda(src), &dd).ok());
      EXPECT_TRUE(SameBytes(dd, dh));
      // Tensor::To(DType) on the device uses the same slot.
      EXPECT_TRUE(SameBytes(*ToCuda(src).To(to), dh));
    }
  }
  // Subnormal and overflowing fp16 results round as core/half.h does.
  const Tensor edge = *Tensor::FromVector(
      {1e-6f, -3e-7f, 6e-8f, 70000.0f, -65520.0f, 65519.0f, 0.0f, -0.0f}, {8},
      kF32);
  Tensor eh = Tensor::Empty({8}, kF16);
  Tensor ed = Tensor::Empty({8}, kF16, KernelDevice());
  ASSERT_TRUE(Convert(edge, &eh).ok());
  ASSERT_TRUE(Convert(ToCuda(edge), &ed).ok());
  EXPECT_TRUE(SameBytes(ed, eh));
}

// One fp32 operation (a fused multiply-add for Accumulate) and one output
// rounding on both sides: bit for bit.
TEST_F(CudaKernelTest, ScaleAddAccumulateAreExact) {
  for (const DTypeMix& mix : kUnaryMixes) {
    SCOPED_TRACE(Name(mix.in) + " -> " + Name(mix.out));
    const Tensor xh = RandomHost({4099}, mix.in, 14);
    const Tensor bh = RandomHost({4099}, mix.out, 15);
    const Tensor xd = ToCuda(xh), bd = ToCuda(bh);
    Tensor yh = Tensor::Empty({4099}, mix.out);
    Tensor yd = Tensor::Empty({4099}, mix.out, KernelDevice());
    ASSERT_TRUE(Scale(xh, -1.37f, &yh).ok());
    ASSERT_TRUE(Scale(xd, -1.37f, &yd).ok());
    EXPECT_TRUE(SameBytes(yd, yh)) << "Scale";
    ASSERT_TRUE(Add(xh, bh, &yh).ok());
    ASSERT_TRUE(Add(xd, bd, &yd).ok());
    EXPECT_TRUE(SameBytes(yd, yh)) << "Add";
    Pair acc = Both(bh);
    ASSERT_TRUE(Accumulate(xh, 0.3f, &acc.host).ok());
    ASSERT_TRUE(Accumulate(xd, 0.3f, &acc.dev).ok());
    EXPECT_TRUE(SameBytes(acc.dev, acc.host)) << "Accumulate";
  }
}

// ---- Layout ---------------------------------------------------------------

// Elements are moved, never converted: bit for bit, through every op built
// on the StridedCopy slot, for every element size.
TEST_F(CudaKernelTest, StridedCopyIsExact) {
  for (DType dt : {kF32, kBF16, DType::kInt64}) {
    SCOPED_TRACE(Name(dt));
    const Tensor x = RandomHost({3, 5, 7, 2}, dt, 40, -100.0f, 100.0f);
    const Tensor xd = ToCuda(x);
    for (const std::vector<int>& perm :
         {std::vector<int>{1, 0, 2, 3}, {3, 2, 1, 0}, {0, 2, 1, 3}}) {
      Shape ys;
      for (int p : perm) ys.push_back(x.shape()[p]);
      Tensor yh = Tensor::Empty(ys, dt);
      Tensor yd = Tensor::Empty(ys, dt, KernelDevice());
      ASSERT_TRUE(Permute(x, perm, &yh).ok());
      ASSERT_TRUE(Permute(xd, perm, &yd).ok());
      EXPECT_TRUE(SameBytes(yd, yh))
          << "perm " << perm[0] << perm[1] << perm[2] << perm[3];
    }
    // Split along dimension 2 into 3 + 4, and back.
    Pair a{Tensor::Empty({3, 5, 3, 2}, dt),
           Tensor::Empty({3, 5, 3, 2}, dt, KernelDevice())};
    Pair b{Tensor::Empty({3, 5, 4, 2}, dt),
           Tensor::Empty({3, 5, 4, 2}, dt, KernelDevice())};
    ASSERT_TRUE(Split(x, 2, {&a.host, &b.host}).ok());
    ASSERT_TRUE(Split(xd, 2, {&a.dev, &b.dev}).ok());
    EXPECT_TRUE(SameBytes(a.dev, a.host));
    EXPECT_TRUE(SameBytes(b.dev, b.host));
    Tensor back = Tensor::Empty(x.shape(), dt, KernelDevice());
    ASSERT_TRUE(Concat({a.dev, b.dev}, 2, &back).ok());
    EXPECT_TRUE(SameBytes(back, x));
    // A KV-cache write at an offset: elements outside the plan untouched.
    StridedCopyPlan plan;
    plan.rank = 2;
    plan.shape[0] = 3;
    plan.shape[1] = 14;
    plan.src_strides[0] = 70;
    plan.src_strides[1] = 1;
    plan.dst_strides[0] = 40;
    plan.dst_strides[1] = 1;
    plan.src_offset = 3;
    plan.dst_offset = 11;
    Pair cache = Both(RandomHost({3, 40}, dt, 41));
    ASSERT_TRUE(CopyStrided(x, plan, &cache.host).ok());
    ASSERT_TRUE(CopyStrided(xd, plan, &cache.dev).ok());
    EXPECT_TRUE(SameBytes(cache.dev, cache.host));
  }
}

// ---- Loss sum ---------------------------------------------------------------

// Float64 sums in token order of exact products: the CPU's bits, with and
// without a mask, int32 and int64 labels, overwriting and accumulating; a
// NaN loss at an ignored token stays out. The gradient reads the count on
// the device and rounds as the CPU does.
TEST_F(CudaKernelTest, LossSumAndGradientAreExact) {
  const int64_t tokens = 1337;  // Several chunks of the kernel's block.
  for (DType lt : {DType::kInt32, DType::kInt64}) {
    for (bool masked : {false, true}) {
      SCOPED_TRACE(Name(lt) + (masked ? " masked" : ""));
      Tensor loss = RandomHost({tokens}, kF32, 50, 0.0f, 11.0f);
      std::vector<int64_t> labels(tokens);
      for (int64_t t = 0; t < tokens; ++t) {
        labels[t] = t % 5 == 2 ? kDefaultIgnoreIndex : t % 97;
      }
      // An ignored token's loss may be anything: it must not be added.
      Tensor loss_nan = loss.Clone();
      ASSERT_TRUE(
          loss_nan.Slice(2, 3)->CopyFrom(*Tensor::FromVector({NAN}, {1})).ok());
      const Tensor lab = *Tensor::FromInts(labels, {tokens}, lt);
      const Tensor mask =
          masked ? RandomHost({tokens}, kF32, 51, 0.0f, 1.0f) : Tensor();
      const Tensor mask_d = masked ? ToCuda(mask) : Tensor();
      Pair out = Both(RandomHost({4}, kF32, 52));
      ASSERT_TRUE(LossSum(loss_nan, mask, lab, kDefaultIgnoreIndex,
                          /*accumulate=*/false, &out.host)
                      .ok());
      ASSERT_TRUE(LossSum(ToCuda(loss_nan), mask_d, ToCuda(lab),
                          kDefaultIgnoreIndex, /*accumulate=*/false, &out.dev)
                      .ok());
      EXPECT_TRUE(SameBytes(out.dev, out.host)) << "overwrite";
      ASSERT_TRUE(LossSum(loss, mask, lab, kDefaultIgnoreIndex,
                          /*accumulate=*/true, &out.host)
                      .ok());
      ASSERT_TRUE(LossSum(ToCuda(loss), mask_d, ToCuda(lab),
                          kDefaultIgnoreIndex, /*accumulate=*/true, &out.dev)
                      .ok());
      EXPECT_TRUE(SameBytes(out.dev, out.host)) << "accumulate";
      Tensor dh = Tensor::Empty({tokens}, kF32);
      Tensor dd = Tensor::Empty({tokens}, kF32, KernelDevice());
      ASSERT_TRUE(LossSumGradient(out.host, mask, 0.25f, &dh).ok());
      ASSERT_TRUE(LossSumGradient(out.dev, mask_d, 0.25f, &dd).ok());
      EXPECT_TRUE(SameBytes(dd, dh)) << "gradient";
    }
  }
  // No tokens: zero sums, and a zero gradient scale.
  Pair empty = Both(RandomHost({4}, kF32, 53));
  const Tensor none = Tensor::Empty({0}, kF32);
  const Tensor no_labels = Tensor::Empty({0}, DType::kInt64);
  ASSERT_TRUE(LossSum(none, Tensor(), no_labels, kDefaultIgnoreIndex, false,
                      &empty.host)
                  .ok());
  ASSERT_TRUE(LossSum(ToCuda(none), Tensor(), ToCuda(no_labels),
                      kDefaultIgnoreIndex, false, &empty.dev)
                  .ok());
  EXPECT_TRUE(SameBytes(empty.dev, empty.host));
}

// ---- Dropout ----------------------------------------------------------------

// The same Philox stream and one multiplication: the CPU's bits, for offsets
// inside a Philox block, p = 0 (a copy), and in place; the backward is the
// same masking.
TEST_F(CudaKernelTest, DropoutIsExact) {
  for (const DTypeMix& mix : kUnaryMixes) {
    for (float p : {0.0f, 0.1f, 0.5f}) {
      for (uint64_t offset : {uint64_t{0}, uint64_t{7}, uint64_t{1} << 33}) {
        SCOPED_TRACE(absl::StrCat(Name(mix.in), " -> ", Name(mix.out), " p ", p,
                                  " offset ", offset));
        const uint64_t seed = 0x1234567890abcdefULL;
        const Tensor xh = RandomHost({3, 333}, mix.in, 95);
        Tensor yh = Tensor::Empty(xh.shape(), mix.out);
        Tensor yd = Tensor::Empty(xh.shape(), mix.out, KernelDevice());
        ASSERT_TRUE(Dropout(xh, p, seed, offset, &yh).ok());
        ASSERT_TRUE(Dropout(ToCuda(xh), p, seed, offset, &yd).ok());
        EXPECT_TRUE(SameBytes(yd, yh));
        if (mix.in == mix.out) {
          Tensor inplace = ToCuda(xh);
          ASSERT_TRUE(DropoutBackward(inplace, p, seed, offset, &inplace).ok());
          EXPECT_TRUE(SameBytes(inplace, yh));
        }
      }
    }
  }
}

// ---- Rotary -----------------------------------------------------------------

// Both sides use the same float64 angles; their cos and sin, rounded to
// fp32, differ by at most one fp32 ulp (2u, |cos|, |sin| <= 1). y = x1 c -
// x2 s rounds twice (a contracted FMA once): |x1| dc + |x2| ds + 2u
// (|x1 c| + |x2 s|) + u |y| between the sides, likewise the second half;
// dims past rotary_dim are copied.
TEST_F(CudaKernelTest, Rotary) {
  for (const DTypeMix& mix : kUnaryMixes) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool backward = variant == 1;
      // Variant 2: Llama 3's scaled frequencies (an original context of 64
      // puts the 8 frequencies in all three bands).
      const bool scaled = variant == 2;
      SCOPED_TRACE(Name(mix.in) + " -> " + Name(mix.out) +
                   (backward ? " backward" : "") + (scaled ? " llama3" : ""));
      const int64_t b = 2, seq = 9, heads = 3, d = 22;
      RotaryOptions options;
      options.rotary_dim = 16;
      options.position_offset = 1000;
      options.llama3.enabled = scaled;
      options.llama3.original_max_position_embeddings = 64;
      const std::vector<double> inv_freq =
          RotaryInverseFrequencies(options, options.rotary_dim);
      const Tensor xh = RandomHost({b, seq, heads, d}, mix.in, 90);
      Tensor yh = Tensor::Empty(xh.shape(), mix.out);
      Tensor yd = Tensor::Empty(xh.shape(), mix.out, KernelDevice());
      if (backward) {
        ASSERT_TRUE(RotaryBackward(xh, options, &yh).ok());
        ASSERT_TRUE(RotaryBackward(ToCuda(xh), options, &yd).ok());
      } else {
        ASSERT_TRUE(RotaryForward(xh, options, &yh).ok());
        ASSERT_TRUE(RotaryForward(ToCuda(xh), options, &yd).ok());
      }
      const std::vector<double> x = Values(xh), want = Values(yh);
      std::vector<double> delta(x.size(), 1e-30);
      const int64_t half = options.rotary_dim / 2;
      for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
        const int64_t j = i % d;
        if (j >= options.rotary_dim) continue;  // Copied: exact.
        const int64_t t = (i / (heads * d)) % seq + options.position_offset;
        const int64_t p = j < half ? j : j - half;
        const double theta = t * inv_freq[p];
        const double c = std::fabs(std::cos(theta)),
                     s = std::fabs(std::sin(theta));
        const double x1 = std::fabs(x[i - (j < half ? 0 : half)]);
        const double x2 = std::fabs(x[i + (j < half ? half : 0)]);
        delta[i] = 2 * kU * (x1 + x2) + 2 * kU * (x1 * c + x2 * s) +
                   kU * std::fabs(want[i]) + 1e-30;
      }
      EXPECT_TRUE(
          WithinBound(Values(yd), want, OutBound(mix.out, want, delta)));
      if (mix.in == mix.out) {  // In place: the same values.
        Tensor inplace = ToCuda(xh);
        ASSERT_TRUE((backward ? RotaryBackward(inplace, options, &inplace)
                              : RotaryForward(inplace, options, &inplace))
                        .ok());
        EXPECT_TRUE(SameBytes(inplace, yd));
      }
    }
  }
}

// ---- Reductions -------------------------------------------------------------

// The CPU's summation order on the device: the same float64 bits, for sizes
// around the block (1024) and partial (65536) boundaries.
TEST_F(CudaKernelTest, ReduceIsExact) {
  for (DType dt : {kF32, kBF16, kF16}) {
    for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{1024}, int64_t{1033},
                      int64_t{65536 * 2 + 1000}}) {
      SCOPED_TRACE(absl::StrCat(Name(dt), " n ", n));
      const Tensor x = RandomHost({n}, dt, 60, -3.0f, 3.0f);
      const Tensor xd = ToCuda(x);
      EXPECT_EQ(*Sum(xd), *Sum(x));
      EXPECT_EQ(*SumOfSquares(xd), *SumOfSquares(x));
      EXPECT_EQ(*L2Norm(xd), *L2Norm(x));
    }
  }
}

// Per-tensor sums in the CPU's order, added in list order: the CPU's bits,
// including the zero count, the scale, and the +inf that an inf or NaN in a
// counted or a checked tensor gives.
TEST_F(CudaKernelTest, MultiTensorSumOfSquaresIsExact) {
  std::vector<Tensor> counted = {
      RandomHost({1000, 7}, kF32, 61), RandomHost({33}, kBF16, 62),
      RandomHost({65536 + 5}, kF16, 63), Tensor::Zeros({0}, kF32)};
  // Some exact zeros of both signs to count.
  ASSERT_TRUE(counted[1].Slice(3, 8)->CopyFrom(Tensor::Zeros({5}, kBF16)).ok());
  ASSERT_TRUE(
      counted[0].Slice(2, 3)->CopyFrom(Tensor::Full({1, 7}, -0.0, kF32)).ok());
  std::vector<Tensor> checked = {RandomHost({129}, kF32, 64)};
  auto to_dev = [](const std::vector<Tensor>& ts) {
    std::vector<Tensor> out;
    for (const Tensor& t : ts) out.push_back(ToCuda(t));
    return out;
  };
  SumOfSquaresOptions options;
  options.scale = 0.125;
  options.count_zeros = true;
  Pair out = Both(RandomHost({4}, kF32, 65));
  ASSERT_TRUE(
      MultiTensorSumOfSquares(counted, checked, options, &out.host).ok());
  ASSERT_TRUE(MultiTensorSumOfSquares(to_dev(counted), to_dev(checked), options,
                                      &out.dev)
                  .ok());
  EXPECT_TRUE(SameBytes(out.dev, out.host));
  EXPECT_GT(Values(out.host)[2], 0.0);  // Zeros were counted.
  // An inf in a checked tensor: +inf, 0 on both.
  ASSERT_TRUE(checked[0]
                  .Slice(100, 101)
                  ->CopyFrom(*Tensor::FromVector({INFINITY}, {1}))
                  .ok());
  options.count_zeros = false;
  ASSERT_TRUE(
      MultiTensorSumOfSquares(counted, checked, options, &out.host).ok());
  ASSERT_TRUE(MultiTensorSumOfSquares(to_dev(counted), to_dev(checked), options,
                                      &out.dev)
                  .ok());
  EXPECT_TRUE(SameBytes(out.dev, out.host));
  EXPECT_TRUE(std::isinf(Values(out.host)[0]));
}

// ---- Norms ------------------------------------------------------------------

struct NormCase {
  int64_t rows, h;
  DType x, y, gamma;
};
const NormCase kNormCases[] = {
    {37, 769, kF32, kF32, kF32},   {5, 4096, kF32, kF32, kF32},
    {37, 769, kBF16, kBF16, kF32}, {19, 130, kBF16, kF32, kBF16},
    {11, 257, kF16, kF16, kF32},   {3, 33, kF32, kBF16, kF32},
};

// Row statistics and their bounds. mean: the two sums differ by 2 h u
// sum|x| (and /h rounds once each side). The centred sum of squares: 2 h u
// sum d^2 for the order, 2 sum|d| dmean from the mean's difference, 2u per
// term; var + eps then a correctly rounded sqrt and division: rstd off by
// rstd (0.5 dvar / (var + eps) + 3u).
struct RowStats {
  double mean = 0, rstd = 0, dmean = 0, drstd = 0;
};
RowStats Stats(const double* x, int64_t h, double eps, bool layer) {
  RowStats s;
  double sum = 0, abs_sum = 0;
  for (int64_t i = 0; i < h; ++i) {
    sum += x[i];
    abs_sum += std::fabs(x[i]);
  }
  if (layer) {
    s.mean = sum / h;
    s.dmean = 2 * h * kU * abs_sum / h + 2 * kU * std::fabs(s.mean);
  }
  double ss = 0, abs_d = 0;
  for (int64_t i = 0; i < h; ++i) {
    const double d = x[i] - s.mean;
    ss += d * d;
    abs_d += std::fabs(d);
  }
  const double var = ss / h;
  const double dvar = (2 * h * kU * ss + 2 * abs_d * s.dmean + 2 * kU * ss) / h;
  s.rstd = 1 / std::sqrt(var + eps);
  s.drstd = s.rstd * (0.5 * dvar / (var + eps) + 3 * kU);
  return s;
}

void CheckNormForward(const NormCase& c, bool layer) {
  SCOPED_TRACE(absl::StrCat(layer ? "LayerNorm " : "RMSNorm ", c.rows, "x", c.h,
                            " x ", Name(c.x), " y ", Name(c.y), " gamma ",
                            Name(c.gamma)));
  const float eps = 1e-5f;
  // An offset mean, so that the centring matters.
  const Tensor xh = RandomHost({c.rows, c.h}, c.x, 16, 1.0f, 5.0f);
  const Tensor gh = RandomHost({c.h}, c.gamma, 17, 0.5f, 1.5f);
  const Tensor bh = RandomHost({c.h}, c.gamma, 18);
  Tensor yh = Tensor::Empty({c.rows, c.h}, c.y);
  Tensor yd = Tensor::Empty({c.rows, c.h}, c.y, KernelDevice());
  Pair mean{Tensor::Empty({c.rows}, kF32),
            Tensor::Empty({c.rows}, kF32, KernelDevice())};
  Pair rstd{Tensor::Empty({c.rows}, kF32),
            Tensor::Empty({c.rows}, kF32, KernelDevice())};
  if (layer) {
    ASSERT_TRUE(
        LayerNormForward(xh, gh, bh, eps, &yh, &mean.host, &rstd.host).ok());
    ASSERT_TRUE(LayerNormForward(ToCuda(xh), ToCuda(gh), ToCuda(bh), eps, &yd,
                                 &mean.dev, &rstd.dev)
                    .ok());
  } else {
    ASSERT_TRUE(RMSNormForward(xh, gh, eps, &yh, &rstd.host).ok());
    ASSERT_TRUE(
        RMSNormForward(ToCuda(xh), ToCuda(gh), eps, &yd, &rstd.dev).ok());
  }
  const std::vector<double> x = Values(xh), g = Values(gh), b = Values(bh),
                            want = Values(yh);
  std::vector<double> dy(x.size()), dmean(c.rows), drstd(c.rows);
  for (int64_t r = 0; r < c.rows; ++r) {
    const RowStats s = Stats(&x[r * c.h], c.h, eps, layer);
    dmean[r] = s.dmean;
    drstd[r] = s.drstd;
    for (int64_t i = 0; i < c.h; ++i) {
      const double d = x[r * c.h + i] - s.mean;
      const double xg = std::fabs(d * s.rstd * g[i]);
      // y = (x - mean) rstd gamma + beta: the statistics' differences
      // scaled by gamma, plus four roundings of the terms.
      dy[r * c.h + i] =
          std::fabs(g[i]) * (s.rstd * s.dmean + std::fabs(d) * s.drstd) +
          4 * kU * (xg + (layer ? std::fabs(b[i]) : 0.0)) + 1e-30;
    }
  }
  EXPECT_TRUE(WithinBound(Values(yd), want, OutBound(c.y, want, dy)));
  if (layer)
    EXPECT_TRUE(WithinBound(Values(mean.dev), Values(mean.host), dmean));
  EXPECT_TRUE(WithinBound(Values(rstd.dev), Values(rstd.host), drstd));
}

TEST_F(CudaKernelTest, LayerNormForward) {
  for (const NormCase& c : kNormCases) CheckNormForward(c, /*layer=*/true);
}

TEST_F(CudaKernelTest, RMSNormForward) {
  for (const NormCase& c : kNormCases) CheckNormForward(c, /*layer=*/false);
}

// Both backward runs take the CPU forward's mean and rstd, so xhat = (x -
// mean) rstd and g = dy gamma are the same values on both sides. dx = rstd
// (g - m1 - xhat m2) with m1 = mean(g), m2 = mean(g xhat): the means differ
// by 2 h u mean|terms| + 2u |mean| each, and the expression's four
// roundings by 4u (|g| + |m1| + |xhat m2|). dgamma += sum_r dy xhat and
// dbeta += sum_r dy: 2 (rows + 1) u sum|terms| + 2u (|old| + |sum|).
void CheckNormBackward(const NormCase& c, bool layer, bool with_params) {
  SCOPED_TRACE(absl::StrCat(layer ? "LayerNorm " : "RMSNorm ", c.rows, "x", c.h,
                            " x ", Name(c.x), " dx ", Name(c.y), " gamma ",
                            Name(c.gamma),
                            with_params ? "" : " (no parameter grads)"));
  const float eps = 1e-5f;
  const Tensor xh = RandomHost({c.rows, c.h}, c.x, 19, 1.0f, 5.0f);
  const Tensor gh = RandomHost({c.h}, c.gamma, 20, 0.5f, 1.5f);
  const Tensor bh = RandomHost({c.h}, c.gamma, 21);
  const Tensor dyh = RandomHost({c.rows, c.h}, c.x, 22);
  Tensor y = Tensor::Empty({c.rows, c.h}, c.x);
  Tensor mean = Tensor::Empty({c.rows}, kF32),
         rstd = Tensor::Empty({c.rows}, kF32);
  if (layer) {
    ASSERT_TRUE(LayerNormForward(xh, gh, bh, eps, &y, &mean, &rstd).ok());
  } else {
    ASSERT_TRUE(RMSNormForward(xh, gh, eps, &y, &rstd).ok());
  }
  Tensor dxh = Tensor::Empty({c.rows, c.h}, c.y);
  Tensor dxd = Tensor::Empty({c.rows, c.h}, c.y, KernelDevice());
  Pair dgamma = Both(RandomHost({c.h}, kF32, 23));  // Accumulated into.
  Pair dbeta = Both(RandomHost({c.h}, kF32, 24));
  const std::vector<double> dg0 = Values(dgamma.host), db0 = Values(dbeta.host);
  Tensor* dgh = with_params ? &dgamma.host : nullptr;
  Tensor* dgd = with_params ? &dgamma.dev : nullptr;
  Tensor* dbh = with_params ? &dbeta.host : nullptr;
  Tensor* dbd = with_params ? &dbeta.dev : nullptr;
  if (layer) {
    ASSERT_TRUE(
        LayerNormBackward(dyh, xh, gh, mean, rstd, &dxh, dgh, dbh).ok());
    ASSERT_TRUE(LayerNormBackward(ToCuda(dyh), ToCuda(xh), ToCuda(gh),
                                  ToCuda(mean), ToCuda(rstd), &dxd, dgd, dbd)
                    .ok());
  } else {
    ASSERT_TRUE(RMSNormBackward(dyh, xh, gh, rstd, &dxh, dgh).ok());
    ASSERT_TRUE(RMSNormBackward(ToCuda(dyh), ToCuda(xh), ToCuda(gh),
                                ToCuda(rstd), &dxd, dgd)
                    .ok());
  }
  const std::vector<double> x = Values(xh), g = Values(gh), dy = Values(dyh),
                            mu = Values(mean), rs = Values(rstd),
                            want = Values(dxh);
  std::vector<double> ddx(x.size()), sg(c.h, 0), sga(c.h, 0), sb(c.h, 0),
      sba(c.h, 0);
  for (int64_t r = 0; r < c.rows; ++r) {
    const double m = layer ? mu[r] : 0.0;
    double m1 = 0, m2 = 0, a1 = 0, a2 = 0;
    for (int64_t i = 0; i < c.h; ++i) {
      const int64_t k = r * c.h + i;
      const double xhat = (x[k] - m) * rs[r];
      const double gi = dy[k] * g[i];
      m1 += gi;
      a1 += std::fabs(gi);
      m2 += gi * xhat;
      a2 += std::fabs(gi * xhat);
      sg[i] += dy[k] * xhat;
      sga[i] += std::fabs(dy[k] * xhat);
      sb[i] += dy[k];
      sba[i] += std::fabs(dy[k]);
    }
    m1 /= c.h;
    m2 /= c.h;
    const double dm1 = layer ? 2 * kU * a1 + 2 * kU * std::fabs(m1) : 0.0;
    const double dm2 = 2 * kU * a2 + 2 * kU * std::fabs(m2);
    if (!layer) m1 = 0;
    for (int64_t i = 0; i < c.h; ++i) {
      const int64_t k = r * c.h + i;
      const double xhat = (x[k] - m) * rs[r];
      const double gi = dy[k] * g[i];
      ddx[k] =
          rs[r] * (dm1 + std::fabs(xhat) * dm2 +
                   4 * kU *
                       (std::fabs(gi) + std::fabs(m1) + std::fabs(xhat * m2))) +
          1e-30;
    }
  }
  EXPECT_TRUE(WithinBound(Values(dxd), want, OutBound(c.y, want, ddx)));
  if (!with_params) {
    // Untouched when null.
    EXPECT_TRUE(SameBytes(dgamma.dev, dgamma.host));
    return;
  }
  std::vector<double> bg(c.h), bb(c.h);
  for (int64_t i = 0; i < c.h; ++i) {
    bg[i] = 2 * (c.rows + 1) * kU * sga[i] +
            2 * kU * (std::fabs(dg0[i]) + std::fabs(sg[i]));
    bb[i] = 2 * (c.rows + 1) * kU * sba[i] +
            2 * kU * (std::fabs(db0[i]) + std::fabs(sb[i]));
  }
  const std::vector<double> want_g = Values(dgamma.host);
  EXPECT_TRUE(WithinBound(Values(dgamma.dev), want_g, bg));
  for (int64_t i = 0; i < c.h; ++i) {
    // Accumulated (+=) into main_grad, not overwritten.
    ASSERT_NEAR(want_g[i], dg0[i] + sg[i], bg[i]);
  }
  if (layer) {
    EXPECT_TRUE(WithinBound(Values(dbeta.dev), Values(dbeta.host), bb));
  }
}

TEST_F(CudaKernelTest, LayerNormBackward) {
  for (const NormCase& c : kNormCases) {
    CheckNormBackward(c, /*layer=*/true, /*with_params=*/true);
  }
  CheckNormBackward(kNormCases[0], /*layer=*/true, /*with_params=*/false);
}

TEST_F(CudaKernelTest, RMSNormBackward) {
  for (const NormCase& c : kNormCases) {
    CheckNormBackward(c, /*layer=*/false, /*with_params=*/true);
  }
}

// ---- Cross entropy ----------------------------------------------------------

// Targets in [0, vocab) with every seventh ignored.
Tensor Targets(int64_t rows, int64_t vocab, DType dtype) {
  std::vector<int64_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) {
    t[r] = r % 7 == 3 ? kDefaultIgnoreIndex : (r * 7919 + 13) % vocab;
  }
  return *Tensor::FromInts(t, {rows}, dtype);
}

// lse: V exponentials to 3 ulp (CPU's Exp8, about 2; std::exp; CUDA expf,
// 2) and two sums of V positive terms: the sums differ by (2V + 6) u
// relative, lse by that plus log's and the addition's roundings (2u |lse|
// each side). loss = lse - logit[t] rounds once more each side.
TEST_F(CudaKernelTest, CrossEntropyForward) {
  const int64_t rows = 33, vocab = 1001;
  for (DType lt : {kF32, kBF16, kF16}) {
    for (DType tt : {DType::kInt32, DType::kInt64}) {
      SCOPED_TRACE(Name(lt) + " logits, " + Name(tt) + " targets");
      const Tensor logits = RandomHost({rows, vocab}, lt, 25, -8.0f, 8.0f);
      const Tensor targets = Targets(rows, vocab, tt);
      Pair loss{Tensor::Empty({rows}, kF32),
                Tensor::Empty({rows}, kF32, KernelDevice())};
      Pair lse{Tensor::Empty({rows}, kF32),
               Tensor::Empty({rows}, kF32, KernelDevice())};
      ASSERT_TRUE(
          CrossEntropyForward(logits, targets, &loss.host, &lse.host).ok());
      ASSERT_TRUE(CrossEntropyForward(ToCuda(logits), ToCuda(targets),
                                      &loss.dev, &lse.dev)
                      .ok());
      const std::vector<double> want_lse = Values(lse.host),
                                want_loss = Values(loss.host);
      std::vector<double> blse(rows), bloss(rows);
      for (int64_t r = 0; r < rows; ++r) {
        blse[r] = (2 * vocab + 6) * kU + 4 * kU * std::fabs(want_lse[r]);
        bloss[r] = blse[r] + 2 * kU * std::fabs(want_loss[r]);
      }
      EXPECT_TRUE(WithinBound(Values(lse.dev), want_lse, blse));
      EXPECT_TRUE(WithinBound(Values(loss.dev), want_loss, bloss));
    }
  }
}

// With the same lse on both sides, p = exp(logit - lse) has the same
// argument (one IEEE subtraction) and differs by the two exponentials' 3 +
// 2 ulp; (p - [j == t]) dloss rounds twice more each side.
TEST_F(CudaKernelTest, CrossEntropyBackward) {
  const int64_t rows = 29, vocab = 517;
  for (DType lt : {kF32, kBF16}) {
    for (DType out : {kF32, kBF16}) {
      SCOPED_TRACE(Name(lt) + " logits, " + Name(out) + " dlogits");
      const Tensor logits = RandomHost({rows, vocab}, lt, 26, -8.0f, 8.0f);
      const Tensor targets = Targets(rows, vocab, DType::kInt64);
      const Tensor dloss = RandomHost({rows}, kF32, 27, 0.1f, 1.0f);
      Tensor loss = Tensor::Empty({rows}, kF32),
             lse = Tensor::Empty({rows}, kF32);
      ASSERT_TRUE(CrossEntropyForward(logits, targets, &loss, &lse).ok());
      Tensor dh = Tensor::Empty({rows, vocab}, out);
      Tensor dd = Tensor::Empty({rows, vocab}, out, KernelDevice());
      ASSERT_TRUE(CrossEntropyBackward(logits, targets, lse, dloss, &dh).ok());
      ASSERT_TRUE(CrossEntropyBackward(ToCuda(logits), ToCuda(targets),
                                       ToCuda(lse), ToCuda(dloss), &dd)
                      .ok());
      const std::vector<double> z = Values(logits), l = Values(lse),
                                g = Values(dloss), t = Values(targets),
                                want = Values(dh);
      std::vector<double> bound(want.size());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < vocab; ++j) {
          const double p = std::exp(z[r * vocab + j] - l[r]);
          const double q = p - (j == t[r] ? 1.0 : 0.0);
          bound[r * vocab + j] =
              std::fabs(g[r]) * (5 * kU * p + 4 * kU * std::fabs(q)) + 1e-30;
        }
      }
      EXPECT_TRUE(WithinBound(Values(dd), want, OutBound(out, want, bound)));
      if (lt == out) {  // In place: dlogits is logits.
        Tensor inplace = ToCuda(logits);
        ASSERT_TRUE(CrossEntropyBackward(inplace, ToCuda(targets), ToCuda(lse),
                                         ToCuda(dloss), &inplace)
                        .ok());
        EXPECT_TRUE(SameBytes(inplace, dd));
      }
    }
  }
}

// Vocab-parallel cross entropy, one shard of a vocabulary of 3 * 173 with
// 150 valid columns (padding after), targets on and off the shard and
// ignored. The row max is exact; each side's sums hold the same terms, each
// exp within 3 ulp (the CPU's Exp8, about 2) and 2 ulp (expf) and summed in
// float64, then rounded to fp32 once: 7u of the sum. The loss's log (1 ulp
// each side) and subtraction, from the same sums: 4u (|log s| + |loss|).
// The backward, from the same row max and sums: p = exp(x - max) / sum off
// by 5u + 2u relative, (p - [target]) g by 4u |p - [target]| |g| more.
TEST_F(CudaKernelTest, ShardedCrossEntropy) {
  const int64_t rows = 21, local = 173, valid = 150, vocab_start = 173;
  std::vector<int64_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) {
    t[r] = r % 6 == 5 ? kDefaultIgnoreIndex : (r * 37) % (3 * local);
  }
  for (DType lt : {kF32, kBF16}) {
    SCOPED_TRACE(Name(lt));
    const Tensor logits = RandomHost({rows, local}, lt, 80, -8.0f, 8.0f);
    const Tensor targets = *Tensor::FromInts(t, {rows});
    const Tensor ld = ToCuda(logits), td = ToCuda(targets);
    Pair mx{Tensor::Empty({rows}, kF32),
            Tensor::Empty({rows}, kF32, KernelDevice())};
    ASSERT_TRUE(ShardedCrossEntropyRowMax(logits, valid, &mx.host).ok());
    ASSERT_TRUE(ShardedCrossEntropyRowMax(ld, valid, &mx.dev).ok());
    EXPECT_TRUE(SameBytes(mx.dev, mx.host)) << "row max";
    Pair sums{Tensor::Empty({2, rows}, kF32),
              Tensor::Empty({2, rows}, kF32, KernelDevice())};
    ASSERT_TRUE(ShardedCrossEntropySums(logits, targets, mx.host, vocab_start,
                                        valid, &sums.host)
                    .ok());
    ASSERT_TRUE(ShardedCrossEntropySums(ld, td, ToCuda(mx.host), vocab_start,
                                        valid, &sums.dev)
                    .ok());
    const std::vector<double> want_sums = Values(sums.host);
    std::vector<double> bsums(2 * rows, 1e-30);  // Target terms: exact.
    for (int64_t r = 0; r < rows; ++r) bsums[r] = 7 * kU * want_sums[r];
    EXPECT_TRUE(WithinBound(Values(sums.dev), want_sums, bsums)) << "sums";
    Pair loss{Tensor::Empty({rows}, kF32),
              Tensor::Empty({rows}, kF32, KernelDevice())};
    ASSERT_TRUE(ShardedCrossEntropyLoss(sums.host, targets, kDefaultIgnoreIndex,
                                        &loss.host)
                    .ok());
    ASSERT_TRUE(ShardedCrossEntropyLoss(ToCuda(sums.host), td,
                                        kDefaultIgnoreIndex, &loss.dev)
                    .ok());
    const std::vector<double> want_loss = Values(loss.host);
    std::vector<double> bloss(rows);
    for (int64_t r = 0; r < rows; ++r) {
      bloss[r] =
          4 * kU *
              (std::fabs(std::log(want_sums[r])) + std::fabs(want_loss[r])) +
          1e-30;
    }
    EXPECT_TRUE(WithinBound(Values(loss.dev), want_loss, bloss)) << "loss";
    for (DType out : {kF32, kBF16}) {
      SCOPED_TRACE("dlogits " + Name(out));
      const Tensor dloss = RandomHost({rows}, kF32, 81, 0.1f, 1.0f);
      Tensor dh = Tensor::Empty({rows, local}, out);
      Tensor dd = Tensor::Empty({rows, local}, out, KernelDevice());
      ASSERT_TRUE(ShardedCrossEntropyBackward(logits, targets, mx.host,
                                              sums.host, dloss, vocab_start,
                                              valid, kDefaultIgnoreIndex, &dh)
                      .ok());
      ASSERT_TRUE(ShardedCrossEntropyBackward(
                      ld, td, ToCuda(mx.host), ToCuda(sums.host), ToCuda(dloss),
                      vocab_start, valid, kDefaultIgnoreIndex, &dd)
                      .ok());
      const std::vector<double> z = Values(logits), m = Values(mx.host),
                                g = Values(dloss), want = Values(dh);
      std::vector<double> bound(want.size(), 1e-30);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < valid; ++c) {
          const double p = std::exp(z[r * local + c] - m[r]) / want_sums[r];
          const double q = p - (c + vocab_start == t[r] ? 1.0 : 0.0);
          bound[r * local + c] +=
              std::fabs(g[r]) * (7 * kU * p + 4 * kU * std::fabs(q));
        }
      }
      EXPECT_TRUE(WithinBound(Values(dd), want, OutBound(out, want, bound)))
          << "backward";
    }
  }
}

// Host values from the same per-token losses: the CPU's sum, count and mean.
TEST_F(CudaKernelTest, CrossEntropyMeanLossIsExact) {
  const int64_t rows = 45, vocab = 300;
  const Tensor logits = RandomHost({rows, vocab}, kF32, 29, -8.0f, 8.0f);
  const Tensor targets = Targets(rows, vocab, DType::kInt32);
  Tensor loss = Tensor::Empty({rows}, kF32), lse = Tensor::Empty({rows}, kF32);
  ASSERT_TRUE(CrossEntropyForward(logits, targets, &loss, &lse).ok());
  const MeanLoss want = *CrossEntropyMeanLoss(loss, targets);
  const absl::StatusOr<MeanLoss> got =
      CrossEntropyMeanLoss(ToCuda(loss), ToCuda(targets));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->sum, want.sum);
  EXPECT_EQ(got->count, want.count);
  EXPECT_EQ(got->mean, want.mean);
  EXPECT_EQ(want.count, rows - (rows + 3) / 7);  // Every seventh ignored.
}

// The CPU kernel refuses a target outside the vocabulary; the CUDA kernel
// cannot without synchronising, so it makes the loss and the gradient row
// NaN (registrations.h) and leaves the other rows as they should be.
TEST_F(CudaKernelTest, CrossEntropyOutOfRangeTargetIsNaN) {
  if (testing::OnTestDevice()) {
    GTEST_SKIP() << "CUDA-only behaviour: the CPU kernel reports the target";
  }
  const int64_t rows = 4, vocab = 50;
  const Tensor logits = RandomHost({rows, vocab}, kF32, 28);
  const Tensor targets = *Tensor::FromInts({1, 50, -100, 7}, {rows});
  Tensor loss = Tensor::Empty({rows}, kF32, KernelDevice());
  Tensor lse = Tensor::Empty({rows}, kF32, KernelDevice());
  ASSERT_TRUE(
      CrossEntropyForward(ToCuda(logits), ToCuda(targets), &loss, &lse).ok());
  const std::vector<double> l = Values(loss);
  EXPECT_FALSE(std::isnan(l[0]));
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_EQ(l[2], 0.0);
  EXPECT_FALSE(std::isnan(l[3]));
  Tensor dlogits = Tensor::Empty({rows, vocab}, kF32, KernelDevice());
  const Tensor dloss = Tensor::Full({rows}, 1.0, kF32, KernelDevice());
  ASSERT_TRUE(CrossEntropyBackward(ToCuda(logits), ToCuda(targets), lse, dloss,
                                   &dlogits)
                  .ok());
  const std::vector<double> d = Values(dlogits);
  for (int64_t j = 0; j < vocab; ++j) {
    EXPECT_FALSE(std::isnan(d[j]));
    EXPECT_TRUE(std::isnan(d[vocab + j]));
    EXPECT_EQ(d[2 * vocab + j], 0.0);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
