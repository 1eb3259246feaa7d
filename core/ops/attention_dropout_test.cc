// Attention dropout inside the fused kernel: against a float64 naive
// attention with the same masks (drawn from the documented stream), its
// gradients against finite differences of that reference, and head slices
// (tensor-parallel ranks) drawing the full run's masks.
#include <cmath>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/dropout.h"
#include "core/ops/nn_test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectClose;
using testing::NumericGrad;

constexpr int64_t kB = 2, kS = 37, kH = 4, kD = 8;
constexpr float kP = 0.3f;
constexpr uint64_t kSeed = 99, kOffset = 12345;

int64_t Idx(int64_t bi, int64_t t, int64_t h, int64_t x) {
  return ((bi * kS + t) * kH + h) * kD + x;
}

// keep / (1 - p) for probability (bi, h, i, j), as AttentionOptions says.
double MaskOf(int64_t bi, int64_t h, int64_t i, int64_t j) {
  uint32_t w;
  PhiloxStream(kSeed, kOffset + ((bi * kH + h) * kS + i) * kS + j, 1, &w);
  const uint32_t threshold =
      static_cast<uint32_t>(std::lround(kP * 16777216.0));
  return (w >> 8) >= threshold ? 1.0 / (1.0 - kP) : 0.0;
}

// Causal attention with dropout on the probabilities, float64.
std::vector<double> Reference(const std::vector<double>& q,
                              const std::vector<double>& k,
                              const std::vector<double>& v) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  std::vector<double> o(q.size(), 0.0), p(kS);
  for (int64_t bi = 0; bi < kB; ++bi) {
    for (int64_t h = 0; h < kH; ++h) {
      for (int64_t i = 0; i < kS; ++i) {
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < kD; ++x)
            dot += q[Idx(bi, i, h, x)] * k[Idx(bi, j, h, x)];
          mx = std::max(mx, p[j] = dot * scale);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
        for (int64_t j = 0; j <= i; ++j) {
          const double w = std::exp(p[j] - mx) / sum * MaskOf(bi, h, i, j);
          for (int64_t x = 0; x < kD; ++x)
            o[Idx(bi, i, h, x)] += w * v[Idx(bi, j, h, x)];
        }
      }
    }
  }
  return o;
}

AttentionOptions Options() {
  AttentionOptions o;
  o.dropout_p = kP;
  o.dropout_seed = kSeed;
  o.dropout_offset = kOffset;
  return o;
}

TEST(AttentionDropoutTest, ForwardAndBackwardMatchFloat64Reference) {
  const Shape shape = {kB, kS, kH, kD};
  const auto qd = testing::RandomDoubles(NumElements(shape), 1);
  const auto kd = testing::RandomDoubles(NumElements(shape), 2);
  const auto vd = testing::RandomDoubles(NumElements(shape), 3);
  const auto gd = testing::RandomDoubles(NumElements(shape), 4);
  Tensor q = testing::FromDoubles(qd, shape, DType::kFloat32);
  Tensor k = testing::FromDoubles(kd, shape, DType::kFloat32);
  Tensor v = testing::FromDoubles(vd, shape, DType::kFloat32);
  Tensor dout = testing::FromDoubles(gd, shape, DType::kFloat32);
  Tensor out = Tensor::Empty(shape, DType::kFloat32);
  Tensor lse = Tensor::Empty({kB, kH, kS}, DType::kFloat32);
  ASSERT_TRUE(FlashAttentionForward(q, k, v, Options(), &out, &lse).ok());
  const auto want = Reference(qd, kd, vd);
  ExpectClose(out.ToDoubles(), want, 1e-5, 1e-4, "out");
  // Dropout really dropped something: the output differs from p = 0.
  Tensor plain = Tensor::Empty(shape, DType::kFloat32);
  Tensor lse0 = Tensor::Empty({kB, kH, kS}, DType::kFloat32);
  ASSERT_TRUE(FlashAttentionForward(q, k, v, {}, &plain, &lse0).ok());
  EXPECT_NE(plain.ToDoubles(), out.ToDoubles());

  Tensor dq = Tensor::Empty(shape, DType::kFloat32);
  Tensor dk = Tensor::Empty(shape, DType::kFloat32);
  Tensor dv = Tensor::Empty(shape, DType::kFloat32);
  ASSERT_TRUE(
      FlashAttentionBackward(q, k, v, out, dout, lse, Options(), &dq, &dk, &dv)
          .ok());
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                  const std::vector<double>& vv) {
    const auto o = Reference(qq, kk, vv);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * gd[i];
    return l;
  };
  ExpectClose(dq.ToDoubles(),
              NumericGrad(qd, [&](const auto& x) { return loss(x, kd, vd); }),
              1e-4, 1e-3, "dq");
  ExpectClose(dk.ToDoubles(),
              NumericGrad(kd, [&](const auto& x) { return loss(qd, x, vd); }),
              1e-4, 1e-3, "dk");
  ExpectClose(dv.ToDoubles(),
              NumericGrad(vd, [&](const auto& x) { return loss(qd, kd, x); }),
              1e-4, 1e-3, "dv");
}

// Heads [2, 4) computed alone, as tensor-parallel rank 1 of 2 holds them,
// equal those heads of the full run.
TEST(AttentionDropoutTest, HeadSliceDrawsTheFullRunsMasks) {
  const Shape shape = {kB, kS, kH, kD};
  Tensor q = testing::RandomTensor(shape, DType::kFloat32, 5);
  Tensor k = testing::RandomTensor(shape, DType::kFloat32, 6);
  Tensor v = testing::RandomTensor(shape, DType::kFloat32, 7);
  Tensor out = Tensor::Empty(shape, DType::kFloat32);
  Tensor lse = Tensor::Empty({kB, kH, kS}, DType::kFloat32);
  ASSERT_TRUE(FlashAttentionForward(q, k, v, Options(), &out, &lse).ok());
  // The slice of heads 2 and 3.
  auto slice = [&](const Tensor& t) {
    Tensor s = Tensor::Empty({kB, kS, 2, kD}, DType::kFloat32);
    const float* src = t.data<float>();
    float* dst = s.data<float>();
    for (int64_t r = 0; r < kB * kS; ++r) {
      for (int64_t x = 0; x < 2 * kD; ++x)
        dst[r * 2 * kD + x] = src[r * kH * kD + 2 * kD + x];
    }
    return s;
  };
  AttentionOptions o = Options();
  o.head_offset = 2;
  o.total_heads = kH;
  Tensor part = Tensor::Empty({kB, kS, 2, kD}, DType::kFloat32);
  Tensor lse_part = Tensor::Empty({kB, 2, kS}, DType::kFloat32);
  ASSERT_TRUE(
      FlashAttentionForward(slice(q), slice(k), slice(v), o, &part, &lse_part)
          .ok());
  EXPECT_EQ(part.ToDoubles(), slice(out).ToDoubles());
  o.head_offset = 3;  // Heads 3 and 4 of 4 do not exist.
  EXPECT_FALSE(
      FlashAttentionForward(slice(q), slice(k), slice(v), o, &part, &lse_part)
          .ok());
}

}  // namespace
}  // namespace ops
}  // namespace mcc
