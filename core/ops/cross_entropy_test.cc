#include "core/ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/cpu_isa.h"
#include "core/ops/nn_internal.h"
#include "core/ops/nn_test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectClose;
using testing::NumericGrad;

// float64 per-token loss; 0 for ignored tokens.
std::vector<double> LossRef(const std::vector<double>& x,
                            const std::vector<int64_t>& t, int64_t vocab,
                            std::vector<double>* lse = nullptr) {
  const int64_t rows = t.size();
  std::vector<double> loss(rows, 0.0);
  if (lse) lse->assign(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -1e300;
    for (int64_t c = 0; c < vocab; ++c) mx = std::max(mx, x[r * vocab + c]);
    double s = 0.0;
    for (int64_t c = 0; c < vocab; ++c) s += std::exp(x[r * vocab + c] - mx);
    const double l = mx + std::log(s);
    if (lse) (*lse)[r] = l;
    if (t[r] != kDefaultIgnoreIndex) loss[r] = l - x[r * vocab + t[r]];
  }
  return loss;
}

std::vector<int64_t> Targets(int64_t rows, int64_t vocab, uint32_t seed) {
  std::vector<int64_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) {
    t[r] = (r % 4 == 2) ? kDefaultIgnoreIndex : (r * 7 + seed) % vocab;
  }
  return t;
}

class CrossEntropyTest
    : public ::testing::TestWithParam<std::tuple<int64_t, DType>> {};

TEST_P(CrossEntropyTest, MatchesFloat64AndFiniteDifferences) {
  const int64_t vocab = std::get<0>(GetParam());
  const DType tdtype = std::get<1>(GetParam());
  const int64_t rows = 7;
  // Offsets far from 0 check the max-subtraction.
  Tensor logits = testing::RandomTensor({rows, vocab}, DType::kFloat32, vocab,
                                        20.0f, 26.0f);
  const std::vector<int64_t> t = Targets(rows, vocab, 3);
  Tensor targets = Tensor::FromInts(t, {rows}, tdtype).value();
  Tensor loss = Tensor::Full({rows}, 9.0, DType::kFloat32);
  Tensor lse = Tensor::Full({rows}, 9.0, DType::kFloat32);
  ASSERT_TRUE(CrossEntropyForward(logits, targets, &loss, &lse).ok());
  const std::vector<double> x = logits.ToDoubles();
  std::vector<double> lse_ref;
  ExpectClose(loss.ToDoubles(), LossRef(x, t, vocab, &lse_ref), 1e-5, 1e-5,
              "loss");
  ExpectClose(lse.ToDoubles(), lse_ref, 1e-5, 1e-6, "lse");

  Tensor dloss = testing::RandomTensor({rows}, DType::kFloat32, 5, 0.5f, 2.0f);
  const std::vector<double> w = dloss.ToDoubles();
  Tensor dlogits = Tensor::Full({rows, vocab}, 9.0, DType::kFloat32);
  ASSERT_TRUE(CrossEntropyBackward(logits, targets, lse, dloss, &dlogits).ok());
  const auto g = NumericGrad(x, [&](const std::vector<double>& v) {
    const auto l = LossRef(v, t, vocab);
    double acc = 0.0;
    for (int64_t r = 0; r < rows; ++r) acc += l[r] * w[r];
    return acc;
  });
  ExpectClose(dlogits.ToDoubles(), g, 1e-5, 1e-4, "dlogits");

  // In place: dlogits written over logits.
  Tensor inplace = logits.Clone();
  ASSERT_TRUE(
      CrossEntropyBackward(inplace, targets, lse, dloss, &inplace).ok());
  ExpectClose(inplace.ToDoubles(), dlogits.ToDoubles(), 0, 0, "in place");

  const MeanLoss m = CrossEntropyMeanLoss(loss, targets).value();
  double sum = 0.0;
  int64_t count = 0;
  const auto ref = LossRef(x, t, vocab);
  for (int64_t r = 0; r < rows; ++r) {
    if (t[r] == kDefaultIgnoreIndex) continue;
    sum += ref[r];
    ++count;
  }
  EXPECT_EQ(m.count, count);
  EXPECT_NEAR(m.mean, sum / count, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Vocab, CrossEntropyTest,
                         ::testing::Combine(::testing::Values(1, 7, 33, 130),
                                            ::testing::Values(DType::kInt32,
                                                              DType::kInt64)));

// bf16 and fp16 logits (fp32 math): the loss within fp32 error of the
// rounded inputs' loss, dlogits within one rounding (2^-8 or 2^-11).
TEST(CrossEntropy16BitTest, WithinRounding) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    const int64_t rows = 9, vocab = 1000;
    Tensor logits = testing::RandomTensor({rows, vocab}, dt, 3, -4, 4);
    const std::vector<int64_t> t = Targets(rows, vocab, 11);
    Tensor targets = Tensor::FromInts(t, {rows}, DType::kInt64).value();
    Tensor loss = Tensor::Empty({rows}, DType::kFloat32);
    Tensor lse = Tensor::Empty({rows}, DType::kFloat32);
    ASSERT_TRUE(CrossEntropyForward(logits, targets, &loss, &lse).ok());
    const auto x = logits.ToDoubles();
    // Inputs are exactly the bf16 values; only fp32 math differs.
    ExpectClose(loss.ToDoubles(), LossRef(x, t, vocab), 1e-5, 1e-5,
                std::string(DTypeName(dt)));
    Tensor dloss = Tensor::Full({rows}, 1.0, DType::kFloat32);
    Tensor dlogits = Tensor::Empty({rows, vocab}, dt);
    ASSERT_TRUE(
        CrossEntropyBackward(logits, targets, lse, dloss, &dlogits).ok());
    std::vector<double> lse_ref;
    LossRef(x, t, vocab, &lse_ref);
    std::vector<double> want(x.size(), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      if (t[r] == kDefaultIgnoreIndex) continue;
      for (int64_t c = 0; c < vocab; ++c) {
        want[r * vocab + c] =
            std::exp(x[r * vocab + c] - lse_ref[r]) - (c == t[r]);
      }
    }
    const double rtol = dt == DType::kBFloat16 ? 8e-3 : 1e-3;
    ExpectClose(dlogits.ToDoubles(), want, 1e-6, rtol,
                std::string(DTypeName(dt)));
  }
}

// The sharded steps over two vocabulary shards (the second padded with
// columns holding huge values, which must take no probability), with the
// reductions done here, against the float64 loss and softmax gradient.
TEST(ShardedCrossEntropyTest, TwoShardsWithPaddingMatchFloat64) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dt));
    const int64_t rows = 10, vocab = 37, local = 24, pad = 2 * local - vocab;
    Tensor full = testing::RandomTensor({rows, vocab}, dt, 21, -4, 4);
    const std::vector<double> x = full.ToDoubles();
    const std::vector<int64_t> t = Targets(rows, vocab, 5);
    Tensor targets = Tensor::FromInts(t, {rows}, DType::kInt32).value();
    // Shard s holds ids [s * local, s * local + local); past vocab: 1e4.
    std::vector<Tensor> shards;
    for (int64_t sh = 0; sh < 2; ++sh) {
      std::vector<float> v(rows * local);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < local; ++c) {
          const int64_t id = sh * local + c;
          v[r * local + c] = id < vocab ? x[r * vocab + id] : 1e4f;
        }
      }
      shards.push_back(
          Tensor::FromVector(v, {rows, local}).value().To(dt).value());
    }
    const int64_t valid[2] = {local, local - pad};
    Tensor row_max = Tensor::Full({rows}, -1e30, DType::kFloat32);
    for (int64_t sh = 0; sh < 2; ++sh) {
      Tensor m = Tensor::Empty({rows}, DType::kFloat32);
      ASSERT_TRUE(ShardedCrossEntropyRowMax(shards[sh], valid[sh], &m).ok());
      for (int64_t r = 0; r < rows; ++r) {
        row_max.data<float>()[r] =
            std::max(row_max.data<float>()[r], m.data<float>()[r]);
      }
    }
    Tensor sums = Tensor::Zeros({2, rows}, DType::kFloat32);
    for (int64_t sh = 0; sh < 2; ++sh) {
      Tensor part = Tensor::Full({2, rows}, 7.0, DType::kFloat32);
      ASSERT_TRUE(ShardedCrossEntropySums(shards[sh], targets, row_max,
                                          sh * local, valid[sh], &part)
                      .ok());
      for (int64_t i = 0; i < 2 * rows; ++i)
        sums.data<float>()[i] += part.data<float>()[i];
    }
    Tensor loss = Tensor::Empty({rows}, DType::kFloat32);
    ASSERT_TRUE(
        ShardedCrossEntropyLoss(sums, targets, kDefaultIgnoreIndex, &loss)
            .ok());
    std::vector<double> lse_ref;
    ExpectClose(loss.ToDoubles(), LossRef(x, t, vocab, &lse_ref), 1e-5, 1e-5,
                "loss");
    Tensor dloss = testing::RandomTensor({rows}, DType::kFloat32, 6, 0.5, 2);
    for (int64_t sh = 0; sh < 2; ++sh) {
      Tensor dlogits = Tensor::Full({rows, local}, 3.0, dt);
      ASSERT_TRUE(ShardedCrossEntropyBackward(
                      shards[sh], targets, row_max, sums, dloss, sh * local,
                      valid[sh], kDefaultIgnoreIndex, &dlogits)
                      .ok());
      std::vector<double> want(rows * local, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        if (t[r] == kDefaultIgnoreIndex) continue;
        for (int64_t c = 0; c < valid[sh]; ++c) {
          const int64_t id = sh * local + c;
          want[r * local + c] =
              (std::exp(x[r * vocab + id] - lse_ref[r]) - (id == t[r])) *
              dloss.ToDoubles()[r];
        }
      }
      // fp32: Exp8's ~2 ulp and lse's fp32 rounding; bf16 output: one more
      // rounding of 2^-8.
      const double rtol = dt == DType::kBFloat16 ? 8e-3 : 1e-5;
      ExpectClose(dlogits.ToDoubles(), want, 1e-6, rtol, "dlogits");
    }
  }
}

void ExpectBackwardMatchesPerElementFormula() {
  const int64_t rows = 4, local = 16 * 5 + 8 + 3, valid = local - 2;
  const int64_t vocab_start = 100;
  const std::vector<int64_t> t = {vocab_start + 17, vocab_start + 90, 5,
                                  kDefaultIgnoreIndex};
  Tensor targets = Tensor::FromInts(t, {rows}, DType::kInt64).value();
  const std::vector<float> mx = {1.5f, -0.25f, 3.0f, 0.0f};
  const std::vector<float> sum = {7.3f, 40.1f, 2.25f, 1.0f};
  const std::vector<float> g = {0.37f, -1.3f, 2.0f, 1.0f};
  Tensor row_max = Tensor::FromVector(mx, {rows}).value();
  std::vector<float> sums_v(2 * rows, 0.0f);
  std::copy(sum.begin(), sum.end(), sums_v.begin());
  Tensor sums = Tensor::FromVector(sums_v, {2, rows}).value();
  Tensor dloss = Tensor::FromVector(g, {rows}).value();
  for (DType ld : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(
          absl::StrCat(DTypeName(ld), " logits, ", DTypeName(gd), " dlogits"));
      std::vector<float> xv =
          testing::RandomTensor({rows, local}, DType::kFloat32, 9, -6, 6)
              .ToFloats();
      xv[5] = -1000.0f;          // exp clamps at -87.3
      xv[local + 20] = -100.0f;  // 16-wide part
      xv[local + 84] = -120.0f;  // 8-wide part
      Tensor logits = Tensor::FromVector(xv, {rows, local}, ld).value();
      const std::vector<float> x = logits.ToFloats();
      Tensor dlogits = Tensor::Full({rows, local}, 3.0, gd);
      ASSERT_TRUE(ShardedCrossEntropyBackward(logits, targets, row_max, sums,
                                              dloss, vocab_start, valid,
                                              kDefaultIgnoreIndex, &dlogits)
                      .ok());
      std::vector<float> want(rows * local, 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        if (t[r] == kDefaultIgnoreIndex) continue;
        const float inv = 1.0f / sum[r];
        for (int64_t c = 0; c < valid; ++c) {
          const float p = nn::ExpS(x[r * local + c] - mx[r]) * inv;
          want[r * local + c] =
              vocab_start + c == t[r] ? p * g[r] - g[r] : p * g[r];
        }
      }
      const Tensor want_t = Tensor::FromVector(want, {rows, local}, gd).value();
      EXPECT_EQ(testing::Bytes(dlogits), testing::Bytes(want_t));
    }
  }
}

// The backward's value per element is fixed by its formula: Exp8's exp of
// (logit - row_max) times 1 / sum, times dloss (minus dloss at the target),
// rounded once to dlogits' dtype; whatever the vector width or ISA (AVX2,
// and AVX-512 where the CPU has it), every element must equal it bit for
// bit. Widths of 16-element vectors plus 8 plus a scalar tail, padding
// columns, a target on another shard, an ignored row, and logits far enough
// below the maximum for exp's clamp.
TEST(ShardedCrossEntropyTest, BackwardBitForBitWithThePerElementFormula) {
  std::vector<CpuIsa> isas = {CpuIsa::kAvx2};
  if (CpuSupportsAvx512()) isas.push_back(CpuIsa::kAvx512);
  for (CpuIsa isa : isas) {
    SCOPED_TRACE(CpuIsaName(isa));
    const CpuIsa saved = internal::SetKernelIsaForTesting(isa);
    ExpectBackwardMatchesPerElementFormula();
    internal::SetKernelIsaForTesting(saved);
  }
}

TEST(ShardedCrossEntropyTest, BadValidCountIsRefused) {
  Tensor logits = Tensor::Zeros({2, 4}, DType::kFloat32);
  Tensor targets = Tensor::FromInts({0, 1}, {2}, DType::kInt64).value();
  Tensor m = Tensor::Empty({2}, DType::kFloat32);
  const absl::Status s = ShardedCrossEntropyRowMax(logits, 5, &m);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("5 valid columns"), std::string::npos) << s;
  Tensor sums = Tensor::Empty({2, 2}, DType::kFloat32);
  EXPECT_FALSE(ShardedCrossEntropySums(logits, targets, m, 0, -1, &sums).ok());
}

TEST(CrossEntropyErrorsTest, OutOfRangeTargetNamesPositionTargetAndVocab) {
  Tensor logits = Tensor::Zeros({4, 10}, DType::kFloat32);
  Tensor targets =
      Tensor::FromInts({1, -100, 10, 3}, {4}, DType::kInt64).value();
  Tensor loss = Tensor::Full({4}, 9.0, DType::kFloat32);
  Tensor lse = Tensor::Full({4}, 9.0, DType::kFloat32);
  absl::Status s = CrossEntropyForward(logits, targets, &loss, &lse);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("target 10 at token position 2"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("[0, 10)"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(loss, 9.0));
  EXPECT_TRUE(testing::AllEqual(lse, 9.0));
  Tensor dlogits = Tensor::Full({4, 10}, 9.0, DType::kFloat32);
  s = CrossEntropyBackward(logits, targets, lse, lse, &dlogits);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(testing::AllEqual(dlogits, 9.0));
}

TEST(CrossEntropyErrorsTest, BadShapesNameBoth) {
  Tensor logits = Tensor::Zeros({4, 10}, DType::kFloat32);
  Tensor targets = Tensor::FromInts({1, 2, 3}, {3}, DType::kInt32).value();
  Tensor loss = Tensor::Full({4}, 9.0, DType::kFloat32);
  Tensor lse = Tensor::Full({4}, 9.0, DType::kFloat32);
  absl::Status s = CrossEntropyForward(logits, targets, &loss, &lse);
  EXPECT_NE(s.message().find("[3]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[4, 10]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(loss, 9.0));
  Tensor targets4 = Tensor::FromInts({1, 2, 3, 4}, {4}, DType::kInt32).value();
  Tensor dlogits = Tensor::Full({4, 11}, 9.0, DType::kFloat32);
  s = CrossEntropyBackward(logits, targets4, lse, lse, &dlogits);
  EXPECT_NE(s.message().find("[4, 11]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[4, 10]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(dlogits, 9.0));
  Tensor loss_bad = Tensor::Full({5}, 9.0, DType::kFloat32);
  s = CrossEntropyForward(logits, targets4, &loss_bad, &lse);
  EXPECT_NE(s.message().find("[5]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(lse, 9.0));
}

TEST(CrossEntropyTestDevice, MatchesCpuBitForBit) {
  Tensor targets = *Tensor::FromInts({3, -100, 0, 19, 7}, {5});
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Tensor logits = testing::RandomTensor({5, 20}, dt, 1, -3.0f, 3.0f);
    Tensor loss = Tensor::Zeros({5}, DType::kFloat32);
    Tensor lse = Tensor::Zeros({5}, DType::kFloat32);
    auto fwd = testing::ExpectSameOnTestDevice(
        {logits, targets, loss, lse}, [](std::vector<Tensor>& t) {
          return CrossEntropyForward(t[0], t[1], &t[2], &t[3]);
        });
    Tensor dloss = testing::RandomTensor({5}, DType::kFloat32, 2);
    Tensor dlogits = Tensor::Zeros({5, 20}, dt);
    testing::ExpectSameOnTestDevice(
        {logits, targets, fwd[3], dloss, dlogits}, [](std::vector<Tensor>& t) {
          return CrossEntropyBackward(t[0], t[1], t[2], t[3], &t[4]);
        });
    Tensor d_targets = *targets.To(Device::TestDevice());
    Tensor d_loss = *fwd[2].To(Device::TestDevice());
    EXPECT_EQ(CrossEntropyMeanLoss(d_loss, d_targets)->sum,
              CrossEntropyMeanLoss(fwd[2], targets)->sum);
    // The sharded steps, on the shard holding columns [8, 20) of 24 (the
    // last 4 padding), with the statistics of that shard alone.
    Tensor shard = testing::RandomTensor({5, 16}, dt, 3, -3.0f, 3.0f);
    Tensor row_max = Tensor::Zeros({5}, DType::kFloat32);
    Tensor sums = Tensor::Zeros({2, 5}, DType::kFloat32);
    auto mx = testing::ExpectSameOnTestDevice(
        {shard, row_max}, [](std::vector<Tensor>& t) {
          return ShardedCrossEntropyRowMax(t[0], 12, &t[1]);
        });
    auto sm = testing::ExpectSameOnTestDevice(
        {shard, targets, mx[1], sums}, [](std::vector<Tensor>& t) {
          return ShardedCrossEntropySums(t[0], t[1], t[2], 8, 12, &t[3]);
        });
    testing::ExpectSameOnTestDevice(
        {sm[3], targets, loss}, [](std::vector<Tensor>& t) {
          return ShardedCrossEntropyLoss(t[0], t[1], -100, &t[2]);
        });
    Tensor dshard = Tensor::Zeros({5, 16}, dt);
    testing::ExpectSameOnTestDevice(
        {shard, targets, mx[1], sm[3], dloss, dshard},
        [](std::vector<Tensor>& t) {
          return ShardedCrossEntropyBackward(t[0], t[1], t[2], t[3], t[4], 8,
                                             12, -100, &t[5]);
        });
    // A target out of range is the same error on both.
    Tensor bad = *Tensor::FromInts({3, 20, 0, 1, 2}, {5});
    testing::ExpectSameOnTestDevice(
        {logits, bad, loss, lse}, [](std::vector<Tensor>& t) {
          return CrossEntropyForward(t[0], t[1], &t[2], &t[3]);
        });
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
