#include "core/ops/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/ops/test_util.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::Bytes;
using testing::ExpectAllNear;
using testing::NumericGrad;
using testing::RandomTensor;

constexpr double kEps32 = 1.0 / (1 << 23);  // fp32 unit roundoff x 2.

// ---- The float64 reference, written out plainly --------------------------

struct RefRoute {
  std::vector<double> scores;   // [t, e]
  std::vector<int> indices;     // [t, k]
  std::vector<double> weights;  // [t, k]
};

std::vector<double> RefScores(const std::vector<double>& l, int64_t t,
                              int64_t e, MoeScoreFunction f) {
  std::vector<double> s(t * e);
  for (int64_t r = 0; r < t; ++r) {
    if (f == MoeScoreFunction::kSigmoid) {
      for (int64_t j = 0; j < e; ++j)
        s[r * e + j] = 1 / (1 + std::exp(-l[r * e + j]));
      continue;
    }
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < e; ++j) mx = std::max(mx, l[r * e + j]);
    for (int64_t j = 0; j < e; ++j) sum += std::exp(l[r * e + j] - mx);
    for (int64_t j = 0; j < e; ++j)
      s[r * e + j] = std::exp(l[r * e + j] - mx) / sum;
  }
  return s;
}

// Chooses with the given indices (the kernel's choice, checked separately)
// so finite differences do not jump between choices.
RefRoute RefRouter(const std::vector<double>& l, int64_t t, int64_t e,
                   const MoeRouterOptions& o, const std::vector<int>& chosen) {
  RefRoute out;
  out.scores = RefScores(l, t, e, o.score_function);
  out.indices = chosen;
  const int64_t k = o.topk;
  out.weights.resize(t * k);
  for (int64_t r = 0; r < t; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < k; ++i)
      sum += out.scores[r * e + chosen[r * k + i]];
    for (int64_t i = 0; i < k; ++i) {
      const double s = out.scores[r * e + chosen[r * k + i]];
      out.weights[r * k + i] =
          o.scaling_factor * (o.normalize_topk ? s / sum : s);
    }
  }
  return out;
}

// Top-k of scores + bias by a stable sort: descending value, lower index
// first among equals.
std::vector<int> RefChoose(const std::vector<double>& s,
                           const std::vector<double>& bias, int64_t t,
                           int64_t e, int64_t k) {
  std::vector<int> out;
  for (int64_t r = 0; r < t; ++r) {
    std::vector<int> order(e);
    std::iota(order.begin(), order.end(), 0);
    auto value = [&](int j) {
      return s[r * e + j] + (bias.empty() ? 0.0 : bias[j]);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return value(a) > value(b); });
    out.insert(out.end(), order.begin(), order.begin() + k);
  }
  return out;
}

double RefBalanceLoss(const std::vector<double>& s, const std::vector<int>& idx,
                      int64_t t, int64_t e, int64_t k, MoeScoreFunction f,
                      int64_t sequences, double coeff) {
  const int64_t len = t / sequences;
  double total = 0;
  for (int64_t g = 0; g < sequences; ++g) {
    std::vector<double> count(e, 0), pmean(e, 0);
    // Sequence-major tokens: sequence g holds tokens g, g + b, g + 2b, ...
    for (int64_t r = g; r < t; r += sequences) {
      double z = 0;
      for (int64_t j = 0; j < e; ++j) z += s[r * e + j];
      for (int64_t j = 0; j < e; ++j) {
        pmean[j] += (f == MoeScoreFunction::kSigmoid ? s[r * e + j] / z
                                                     : s[r * e + j]) /
                    len;
      }
      for (int64_t i = 0; i < k; ++i) count[idx[r * k + i]] += 1;
    }
    double run = 0;
    for (int64_t j = 0; j < e; ++j) run += count[j] / (len * k) * pmean[j];
    total += e * run;
  }
  return coeff * total / sequences;
}

double RefZLoss(const std::vector<double>& l, int64_t t, int64_t e,
                double coeff) {
  double sum = 0;
  for (int64_t r = 0; r < t; ++r) {
    double mx = -1e300, z = 0;
    for (int64_t j = 0; j < e; ++j) mx = std::max(mx, l[r * e + j]);
    for (int64_t j = 0; j < e; ++j) z += std::exp(l[r * e + j] - mx);
    const double lse = mx + std::log(z);
    sum += lse * lse;
  }
  return coeff * sum / t;
}

std::vector<int> Ints(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int>(p, p + t.numel());
}

struct Routed {
  Tensor scores, indices, weights;
};

Routed Route(const Tensor& logits, const Tensor* bias,
             const MoeRouterOptions& o) {
  const int64_t t = logits.size(0), e = logits.size(1);
  Routed r{Tensor::Empty({t, e}, DType::kFloat32),
           Tensor::Empty({t, o.topk}, DType::kInt32),
           Tensor::Empty({t, o.topk}, DType::kFloat32)};
  EXPECT_TRUE(
      MoeRouterForward(logits, bias, o, &r.scores, &r.indices, &r.weights)
          .ok());
  return r;
}

struct Case {
  MoeScoreFunction f;
  int64_t topk;
  bool normalize;
  bool bias;
};

class MoeRouterCaseTest : public ::testing::TestWithParam<Case> {};

// Forward against float64; the backward (combine weights, balancing loss,
// z-loss) against central differences of the float64 reference.
TEST_P(MoeRouterCaseTest, MatchesFloat64ReferenceAndFiniteDifferences) {
  const Case c = GetParam();
  const int64_t t = 12, e = 6;
  MoeRouterOptions o;
  o.topk = c.topk;
  o.score_function = c.f;
  o.normalize_topk = c.normalize;
  o.scaling_factor = 1.5f;
  Tensor logits = RandomTensor({t, e}, DType::kFloat32, 1, -2, 2);
  Tensor bias = RandomTensor({e}, DType::kFloat32, 2, -0.3f, 0.3f);
  const std::vector<double> l = logits.ToDoubles();
  const std::vector<double> b =
      c.bias ? bias.ToDoubles() : std::vector<double>();
  Routed got = Route(logits, c.bias ? &bias : nullptr, o);

  // Scores: exp/sigmoid in fp32 with sums over e terms: relative error
  // below (e + 4) eps; weights add one normalising sum of k terms.
  const std::vector<double> ref_s = RefScores(l, t, e, c.f);
  ExpectAllNear(got.scores.ToDoubles(), ref_s, 0, (e + 4) * kEps32, "scores");
  // The choice is exact unless two values sit within the scores' error of
  // each other; random logits keep a margin, which is checked here.
  const std::vector<int> ref_idx = RefChoose(ref_s, b, t, e, c.topk);
  EXPECT_EQ(Ints(got.indices), ref_idx);
  RefRoute ref = RefRouter(l, t, e, o, ref_idx);
  ExpectAllNear(got.weights.ToDoubles(), ref.weights, 0,
                (e + c.topk + 8) * kEps32, "weights");

  // Backward: L = sum_i dw_i w_i + aux + z, with fixed upstream dw.
  Tensor dw = RandomTensor({t, c.topk}, DType::kFloat32, 3);
  const std::vector<double> dwd = dw.ToDoubles();
  const int64_t sequences = 3;
  const float aux_coeff = 0.3f, z_coeff = 0.05f, grad_scale = 2.0f;
  Tensor dlogits = Tensor::Empty({t, e}, DType::kFloat32);
  ASSERT_TRUE(MoeRouterBackward(got.scores, got.indices, dw, o, &dlogits).ok());
  ASSERT_TRUE(MoeLoadBalancingLossBackward(got.scores, got.indices, c.f,
                                           sequences, aux_coeff, grad_scale,
                                           &dlogits)
                  .ok());
  ASSERT_TRUE(MoeZLossBackward(logits, z_coeff, grad_scale, &dlogits).ok());
  auto objective = [&](const std::vector<double>& x) {
    RefRoute r = RefRouter(x, t, e, o, ref_idx);
    double v = 0;
    for (size_t i = 0; i < dwd.size(); ++i) v += dwd[i] * r.weights[i];
    v += grad_scale * RefBalanceLoss(r.scores, ref_idx, t, e, c.topk, c.f,
                                     sequences, aux_coeff);
    v += grad_scale * RefZLoss(x, t, e, z_coeff);
    return v;
  };
  // Differences of a smooth float64 function with h = 1e-5: truncation
  // O(h^2) ~ 1e-10 and rounding ~1e-16 / h; the kernel's fp32 gradient is
  // within ~(e + k) eps relative of gradients of order 1: 1e-5 absolute
  // holds both with a wide margin and still fails a wrong term.
  ExpectAllNear(dlogits.ToDoubles(), NumericGrad(objective, l, 1e-5), 1e-5,
                1e-4, "dlogits");

  // The losses' values.
  Tensor loss = Tensor::Empty({1}, DType::kFloat32);
  ASSERT_TRUE(MoeLoadBalancingLoss(got.scores, got.indices, c.f, sequences,
                                   aux_coeff, &loss)
                  .ok());
  const double ref_aux =
      RefBalanceLoss(ref_s, ref_idx, t, e, c.topk, c.f, sequences, aux_coeff);
  EXPECT_NEAR(loss.ToDoubles()[0], ref_aux, 2 * (e + 4) * kEps32 * ref_aux);
  ASSERT_TRUE(MoeZLoss(logits, z_coeff, &loss).ok());
  const double ref_z = RefZLoss(l, t, e, z_coeff);
  EXPECT_NEAR(loss.ToDoubles()[0], ref_z, 2 * kEps32 * ref_z);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MoeRouterCaseTest,
    ::testing::Values(Case{MoeScoreFunction::kSoftmax, 2, true, false},
                      Case{MoeScoreFunction::kSoftmax, 2, false, false},
                      Case{MoeScoreFunction::kSoftmax, 1, false, true},
                      Case{MoeScoreFunction::kSoftmax, 3, true, true},
                      Case{MoeScoreFunction::kSigmoid, 2, true, false},
                      Case{MoeScoreFunction::kSigmoid, 4, true, true},
                      Case{MoeScoreFunction::kSigmoid, 1, false, true}));

// One sequence is Megatron's aux_loss: coeff * E * sum_e f_e P_e over the
// whole batch, with f_e = count_e / (T k), P_e = mean_t p_te.
TEST(MoeRouterTest, AuxLossIsTheSwitchFormula) {
  // 2 tokens, 2 experts, k = 1: logits chosen so that p = (0.75, 0.25) and
  // (0.5, 0.5); both tokens pick expert 0 (the tie goes to the lower index).
  Tensor logits =
      Tensor::FromVector({static_cast<float>(std::log(3.0)), 0, 0, 0}, {2, 2})
          .value();
  MoeRouterOptions o;
  o.topk = 1;
  Routed r = Route(logits, nullptr, o);
  EXPECT_EQ(Ints(r.indices), (std::vector<int>{0, 0}));
  Tensor loss = Tensor::Empty({1}, DType::kFloat32);
  ASSERT_TRUE(MoeLoadBalancingLoss(r.scores, r.indices,
                                   MoeScoreFunction::kSoftmax, 1, 0.1f, &loss)
                  .ok());
  // f = (1, 0), P = (0.625, 0.375): 0.1 * 2 * 0.625.
  EXPECT_NEAR(loss.ToDoubles()[0], 0.125, 1e-7);
}

// Context parallelism: two ranks each hold half of every sequence. With
// the whole sequences' counts and length each rank's loss is its share of
// the whole loss (the shares add up to it) and its gradient is the whole
// loss's gradient for its tokens; with only its own counts neither holds.
TEST(MoeRouterTest, SequenceTotalsGiveSharesOfTheWholeLoss) {
  constexpr int64_t t = 24, e = 6, b = 3;
  for (MoeScoreFunction f :
       {MoeScoreFunction::kSoftmax, MoeScoreFunction::kSigmoid}) {
    MoeRouterOptions o;
    o.topk = 2;
    o.score_function = f;
    Tensor logits = RandomTensor({t, e}, DType::kFloat32, 11, -2, 2);
    Routed whole = Route(logits, nullptr, o);
    std::vector<int64_t> counts(b * e, 0);
    const std::vector<int> idx = Ints(whole.indices);
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t i = 0; i < o.topk; ++i)
        ++counts[(r % b) * e + idx[r * 2 + i]];
    }
    Tensor whole_counts = Tensor::FromInts(counts, {b, e}).value();
    Tensor loss = Tensor::Empty({1}, DType::kFloat32);
    ASSERT_TRUE(
        MoeLoadBalancingLoss(whole.scores, whole.indices, f, b, 0.1f, &loss)
            .ok());
    const double whole_loss = loss.ToDoubles()[0];
    Tensor whole_grad = Tensor::Zeros({t, e}, DType::kFloat32);
    ASSERT_TRUE(MoeLoadBalancingLossBackward(whole.scores, whole.indices, f, b,
                                             0.1f, 2.0f, &whole_grad)
                    .ok());
    const std::vector<double> want = whole_grad.ToDoubles();
    for (bool with_totals : {true, false}) {
      MoeSequenceTotals totals;
      if (with_totals) totals = {&whole_counts, t / b};
      double shares = 0;
      std::vector<double> got;
      for (int64_t rank = 0; rank < 2; ++rank) {
        // Rows [12 rank, 12 rank + 12): 4 tokens of each sequence.
        Tensor scores = whole.scores.Slice(12 * rank, 12 * rank + 12).value();
        Tensor indices = whole.indices.Slice(12 * rank, 12 * rank + 12).value();
        ASSERT_TRUE(
            MoeLoadBalancingLoss(scores, indices, f, b, 0.1f, &loss, totals)
                .ok());
        shares += loss.ToDoubles()[0];
        Tensor grad = Tensor::Zeros({12, e}, DType::kFloat32);
        ASSERT_TRUE(MoeLoadBalancingLossBackward(scores, indices, f, b, 0.1f,
                                                 2.0f, &grad, totals)
                        .ok());
        const std::vector<double> g = grad.ToDoubles();
        got.insert(got.end(), g.begin(), g.end());
      }
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::abs(got[i] - want[i]));
      }
      if (with_totals) {
        EXPECT_NEAR(shares, whole_loss, 1e-6 * whole_loss);
        EXPECT_LT(worst, 1e-7);
      } else {
        // Each rank alone: its own counts over half the length.
        EXPECT_GT(std::abs(shares / 2 - whole_loss), 1e-4 * whole_loss);
        EXPECT_GT(worst, 1e-5);
      }
    }
    // Totals of another shape, or shorter than this rank's tokens: refused.
    Tensor wrong = Tensor::FromInts(counts, {e, b}).value();
    EXPECT_FALSE(MoeLoadBalancingLoss(whole.scores, whole.indices, f, b, 0.1f,
                                      &loss, {&wrong, t / b})
                     .ok());
    EXPECT_FALSE(MoeLoadBalancingLoss(whole.scores, whole.indices, f, b, 0.1f,
                                      &loss, {&whole_counts, t / b - 1})
                     .ok());
  }
}

TEST(MoeRouterTest, TiesGoToTheLowerExpertAndBiasOnlyChooses) {
  // Equal logits: experts 0 and 1 chosen, in that order, each weight 1/2.
  Tensor logits = Tensor::Zeros({1, 4}, DType::kFloat32);
  MoeRouterOptions o;
  Routed r = Route(logits, nullptr, o);
  EXPECT_EQ(Ints(r.indices), (std::vector<int>{0, 1}));
  // A bias favouring experts 3 and 2 changes the choice, not the weights'
  // source: they are still the (equal) scores, normalised.
  Tensor bias = Tensor::FromVector({0, 0, 0.1f, 0.2f}, {4}).value();
  r = Route(logits, &bias, o);
  EXPECT_EQ(Ints(r.indices), (std::vector<int>{3, 2}));
  EXPECT_EQ(r.weights.ToDoubles(), (std::vector<double>{0.5, 0.5}));
}

TEST(MoeRouterTest, ResultsIgnoreTheThreadCount) {
  Tensor logits = RandomTensor({4000, 16}, DType::kFloat32, 7, -3, 3);
  MoeRouterOptions o;
  o.topk = 4;
  Tensor dw = RandomTensor({4000, 4}, DType::kFloat32, 8);
  auto run = [&]() {
    Routed r = Route(logits, nullptr, o);
    Tensor dl = Tensor::Empty({4000, 16}, DType::kFloat32);
    EXPECT_TRUE(MoeRouterBackward(r.scores, r.indices, dw, o, &dl).ok());
    EXPECT_TRUE(MoeLoadBalancingLossBackward(
                    r.scores, r.indices, o.score_function, 8, 0.01f, 1.0f, &dl)
                    .ok());
    Tensor loss = Tensor::Empty({1}, DType::kFloat32);
    EXPECT_TRUE(MoeLoadBalancingLoss(r.scores, r.indices, o.score_function, 8,
                                     0.01f, &loss)
                    .ok());
    std::vector<uint8_t> all = Bytes(r.scores);
    for (const Tensor* x : {&r.indices, &r.weights, &dl, &loss}) {
      const std::vector<uint8_t> b = Bytes(*x);
      all.insert(all.end(), b.begin(), b.end());
    }
    return all;
  };
  const int threads = ThreadPool::Global().num_threads();
  ThreadPool::SetGlobalThreads(1);
  const auto one = run();
  ThreadPool::SetGlobalThreads(3);
  const auto three = run();
  ThreadPool::SetGlobalThreads(threads);
  EXPECT_EQ(one, three);
}

TEST(MoeRouterTest, ExpertBiasMovesTowardTheMeanLoad) {
  Tensor counts = Tensor::FromInts({10, 2, 6, 6}, {4}).value();
  Tensor bias = Tensor::Zeros({4}, DType::kFloat32);
  ASSERT_TRUE(MoeUpdateExpertBias(counts, 0.01f, &bias).ok());
  EXPECT_EQ(bias.ToFloats(), (std::vector<float>{-0.01f, 0.01f, 0, 0}));
}

// Every op runs through its slot on a device that is not the host, with
// the CPU's results bit for bit.
TEST(MoeRouterTest, SameOnTheTestDevice) {
  const int64_t t = 20, e = 6;
  MoeRouterOptions o;
  o.topk = 2;
  o.score_function = MoeScoreFunction::kSigmoid;
  Tensor logits = RandomTensor({t, e}, DType::kFloat32, 1, -2, 2);
  Tensor bias = RandomTensor({e}, DType::kFloat32, 2, -0.2f, 0.2f);
  std::vector<Tensor> r = testing::ExpectSameOnTestDevice(
      {logits, bias, Tensor::Zeros({t, e}, DType::kFloat32),
       Tensor::Zeros({t, 2}, DType::kInt32),
       Tensor::Zeros({t, 2}, DType::kFloat32)},
      [&](std::vector<Tensor>& a) {
        return MoeRouterForward(a[0], &a[1], o, &a[2], &a[3], &a[4]);
      },
      "MoeRouterForward");
  Tensor dw = RandomTensor({t, 2}, DType::kFloat32, 3);
  testing::ExpectSameOnTestDevice(
      {logits, r[2], r[3], dw, Tensor::Zeros({t, e}, DType::kFloat32),
       Tensor::Zeros({1}, DType::kFloat32)},
      [&](std::vector<Tensor>& a) -> absl::Status {
        absl::Status s = MoeRouterBackward(a[1], a[2], a[3], o, &a[4]);
        if (s.ok()) {
          s = MoeLoadBalancingLossBackward(a[1], a[2], o.score_function, 4,
                                           0.1f, 1.0f, &a[4]);
        }
        if (s.ok()) s = MoeZLossBackward(a[0], 0.01f, 1.0f, &a[4]);
        if (s.ok()) {
          s = MoeLoadBalancingLoss(a[1], a[2], o.score_function, 4, 0.1f,
                                   &a[5]);
        }
        return s;
      },
      "router backward and losses");
}

TEST(MoeRouterTest, BadArgumentsAreNamedAndNothingIsWritten) {
  Tensor logits = RandomTensor({3, 4}, DType::kFloat32, 1);
  MoeRouterOptions o;
  o.topk = 5;
  Tensor s = Tensor::Zeros({3, 4}, DType::kFloat32);
  Tensor i = Tensor::Zeros({3, 5}, DType::kInt32);
  Tensor w = Tensor::Zeros({3, 5}, DType::kFloat32);
  const auto before = Bytes(s);
  absl::Status st = MoeRouterForward(logits, nullptr, o, &s, &i, &w);
  EXPECT_NE(st.message().find("topk 5 must be in [1, 4]"), std::string::npos)
      << st;
  EXPECT_EQ(Bytes(s), before);
  Tensor bad_idx =
      Tensor::FromInts({0, 4, 1, 2, 3, 0}, {3, 2}, DType::kInt32).value();
  Tensor dl = Tensor::Zeros({3, 4}, DType::kFloat32);
  Tensor dw = Tensor::Zeros({3, 2}, DType::kFloat32);
  o.topk = 2;
  st = MoeRouterBackward(s, bad_idx, dw, o, &dl);
  EXPECT_NE(st.message().find("indices[0, 1] = 4 is not an expert"),
            std::string::npos)
      << st;
  Tensor loss = Tensor::Zeros({1}, DType::kFloat32);
  st = MoeLoadBalancingLoss(s, Tensor::Zeros({3, 2}, DType::kInt32),
                            MoeScoreFunction::kSoftmax, 2, 0.1f, &loss);
  EXPECT_NE(st.message().find("3 tokens do not split into 2 sequences"),
            std::string::npos)
      << st;
}

}  // namespace
}  // namespace ops
}  // namespace mcc
