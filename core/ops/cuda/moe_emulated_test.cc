// The mixture-of-experts CUDA kernels (moe_kernels.cuh), run on the host
// through cuda_emulator.h, against the CPU kernels (core/ops/moe_router.cc,
// moe_permute.cc): router top-k with ties and a bias, its backward, the
// balancing loss per micro-batch and per sequence, the z-loss, the expert
// bias, the token sort over several chunks of a block, an index outside
// the experts, permutation and unpermutation in fp32 and bf16. Each launch
// below is the one moe.cu makes, with smaller blocks so that grid-stride
// loops and chunks go round. Indices, counts and copies must match bit for
// bit; arithmetic within the bounds ExpectNear states. Needs no GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/ops/moe_permute.h"
#include "core/ops/moe_router.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

// After every other header: it defines CUDA's keywords as macros.
#include "core/ops/cuda/emulated_device.h"
// The kernels, after the definitions they expect.
#include "core/ops/cuda/moe_kernels.cuh"

namespace mcc {
namespace ops {
namespace {

namespace moe = ::mcc::cuda_kernels::moe;
using cuda_emu::Dim3;
using cuda_emu::Emulator;
using cuda_kernels::ElemType;

constexpr unsigned int kThreads = 64;  // Small: loops go round.

Tensor Random(const Shape& shape, uint32_t seed, DType dtype = DType::kFloat32,
              float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(NumElements(shape));
  for (float& x : v) x = dist(gen);
  return *Tensor::FromVector(v, shape, dtype);
}

void Launch(unsigned int blocks, size_t shared,
            const std::function<void()>& kernel) {
  Emulator::Launch(Dim3{blocks, 1, 1}, kThreads, shared, kernel);
}

// Bit-identical tensors.
void ExpectSame(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0)
      << what << ": got " << ::testing::PrintToString(got.ToDoubles())
      << "\nwant " << ::testing::PrintToString(want.ToDoubles());
}

// |got - want| <= rel * (|want| + the largest |want|) + one 16-bit rounding
// of want, element-wise. The CPU kernels are built with -mfma, so the
// compiler fuses some of their products and sums (and of these host-built
// device kernels, differently); sums that nearly cancel (the softmax
// backward's dot product) keep only that absolute accuracy.
void ExpectNear(const Tensor& got, const Tensor& want, double rel,
                const char* what) {
  const std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
  ASSERT_EQ(g.size(), w.size()) << what;
  double largest = 0.0;
  for (double v : w) largest = std::max(largest, std::fabs(v));
  const double ulp = want.dtype() == DType::kBFloat16  ? 1.0 / 128
                     : want.dtype() == DType::kFloat16 ? 1.0 / 1024
                                                       : 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_NEAR(g[i], w[i],
                rel * (std::fabs(w[i]) + largest) + ulp * std::fabs(w[i]))
        << what << " element " << i;
  }
}

// Logits with ties: a few tokens have equal logits for several experts.
Tensor RouterLogits(int64_t tokens, int64_t experts, uint32_t seed) {
  Tensor l = Random({tokens, experts}, seed);
  float* p = l.data<float>();
  for (int64_t r = 0; r < tokens; r += 5) {
    for (int64_t j = 1; j < experts; j += 2) p[r * experts + j] = 0.25f;
  }
  return l;
}

struct RouterCase {
  int64_t experts, topk;
  MoeScoreFunction f;
  bool normalize, bias;
};

std::vector<RouterCase> RouterCases() {
  return {{8, 2, MoeScoreFunction::kSoftmax, true, false},
          {8, 3, MoeScoreFunction::kSoftmax, false, true},
          {6, 2, MoeScoreFunction::kSigmoid, true, true},
          {5, 1, MoeScoreFunction::kSigmoid, false, false}};
}

moe::RouterParams Params(const Tensor& logits, const RouterCase& c) {
  moe::RouterParams p;
  p.tokens = logits.size(0);
  p.experts = c.experts;
  p.topk = c.topk;
  p.sigmoid = c.f == MoeScoreFunction::kSigmoid;
  p.normalize = c.normalize;
  p.scaling = 1.5f;
  return p;
}

MoeRouterOptions Options(const RouterCase& c) {
  MoeRouterOptions o;
  o.topk = c.topk;
  o.score_function = c.f;
  o.normalize_topk = c.normalize;
  o.scaling_factor = 1.5f;
  return o;
}

TEST(MoeRouterEmulatedTest, ForwardAndBackwardMatchTheCpuKernels) {
  const int64_t t = 37;
  for (const RouterCase& c : RouterCases()) {
    SCOPED_TRACE(::testing::Message()
                 << "E " << c.experts << " k " << c.topk << " "
                 << MoeScoreFunctionName(c.f) << " normalize " << c.normalize
                 << " bias " << c.bias);
    const Tensor logits = RouterLogits(t, c.experts, 1);
    const Tensor bias = Random({c.experts}, 2, DType::kFloat32, -0.1f, 0.1f);
    const Tensor* b = c.bias ? &bias : nullptr;
    Tensor scores = Tensor::Empty({t, c.experts}, DType::kFloat32);
    Tensor indices = Tensor::Empty({t, c.topk}, DType::kInt32);
    Tensor weights = Tensor::Empty({t, c.topk}, DType::kFloat32);
    ASSERT_TRUE(
        MoeRouterForward(logits, b, Options(c), &scores, &indices, &weights)
            .ok());
    Tensor got_scores = Tensor::Zeros(scores.shape(), DType::kFloat32);
    Tensor got_indices = Tensor::Zeros(indices.shape(), DType::kInt32);
    Tensor got_weights = Tensor::Zeros(weights.shape(), DType::kFloat32);
    moe::RouterParams p = Params(logits, c);
    p.logits = logits.data<float>();
    p.bias = c.bias ? bias.data<float>() : nullptr;
    p.scores = got_scores.data<float>();
    p.indices = got_indices.data<int32_t>();
    p.weights = got_weights.data<float>();
    Launch(1, 0, [&] { moe::RouterForwardKernel(p); });
    ExpectSame(got_indices, indices, "indices");
    ExpectNear(got_scores, scores, 1e-6, "scores");
    ExpectNear(got_weights, weights, 1e-6, "weights");

    const Tensor dweights = Random(weights.shape(), 3);
    Tensor dlogits = Tensor::Empty(scores.shape(), DType::kFloat32);
    ASSERT_TRUE(
        MoeRouterBackward(scores, indices, dweights, Options(c), &dlogits)
            .ok());
    Tensor got = Tensor::Zeros(scores.shape(), DType::kFloat32);
    p.dweights = dweights.data<float>();
    p.dlogits = got.data<float>();
    Launch(1, 0, [&] { moe::RouterBackwardKernel(p); });
    ExpectNear(got, dlogits, 1e-6, "dlogits");
  }
}

TEST(MoeBalanceEmulatedTest, LossesAndGradientsMatchTheCpuKernels) {
  const int64_t t = 36, e = 6, k = 2;
  for (MoeScoreFunction f :
       {MoeScoreFunction::kSoftmax, MoeScoreFunction::kSigmoid}) {
    for (int64_t seqs : {int64_t{1}, int64_t{3}}) {
      SCOPED_TRACE(::testing::Message()
                   << MoeScoreFunctionName(f) << " sequences " << seqs);
      RouterCase c{e, k, f, true, false};
      const Tensor logits = RouterLogits(t, e, 4);
      Tensor scores = Tensor::Empty({t, e}, DType::kFloat32);
      Tensor indices = Tensor::Empty({t, k}, DType::kInt32);
      Tensor weights = Tensor::Empty({t, k}, DType::kFloat32);
      ASSERT_TRUE(MoeRouterForward(logits, nullptr, Options(c), &scores,
                                   &indices, &weights)
                      .ok());
      const float coeff = 0.01f, grad_scale = 0.5f;
      Tensor loss = Tensor::Empty({1}, DType::kFloat32);
      ASSERT_TRUE(
          MoeLoadBalancingLoss(scores, indices, f, seqs, coeff, &loss).ok());
      Tensor dlogits = Random({t, e}, 5);
      Tensor got_dlogits = dlogits.Clone();
      ASSERT_TRUE(MoeLoadBalancingLossBackward(scores, indices, f, seqs, coeff,
                                               grad_scale, &dlogits)
                      .ok());

      std::vector<int64_t> counts(seqs * e);
      std::vector<double> psum(seqs * e);
      std::vector<float> z(t);
      Tensor got_loss = Tensor::Zeros({1}, DType::kFloat32);
      moe::BalanceParams p;
      p.scores = scores.data<float>();
      p.indices = indices.data<int32_t>();
      p.z = z.data();
      p.counts = counts.data();
      p.psum = psum.data();
      p.loss = got_loss.data<float>();
      p.dlogits = got_dlogits.data<float>();
      p.tokens = t;
      p.experts = e;
      p.topk = k;
      p.sequences = seqs;
      p.sigmoid = f == MoeScoreFunction::kSigmoid;
      p.coeff = coeff;
      p.grad_scale = grad_scale;
      if (p.sigmoid) Launch(1, 0, [&] { moe::BalanceNormaliserKernel(p); });
      Launch(1, 0, [&] { moe::BalanceCountsKernel(p); });
      Launch(1, 0, [&] { moe::BalanceLossKernel(p); });
      ExpectNear(got_loss, loss, 1e-6, "loss");
      p.psum = nullptr;  // The backward's launch: counts only.
      Launch(1, 0, [&] { moe::BalanceCountsKernel(p); });
      Launch(1, 0, [&] { moe::BalanceBackwardKernel(p); });
      ExpectNear(got_dlogits, dlogits, 1e-6, "dlogits");
    }
  }
}

TEST(MoeZLossEmulatedTest, LossAndGradientMatchTheCpuKernels) {
  for (int64_t t : {int64_t{0}, int64_t{3}, int64_t{150}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << t);
    const int64_t e = 7;
    const Tensor logits = Random({t, e}, 6, DType::kFloat32, -4.0f, 4.0f);
    Tensor loss = Tensor::Empty({1}, DType::kFloat32);
    ASSERT_TRUE(MoeZLoss(logits, 1e-3f, &loss).ok());
    std::vector<double> terms(std::max<int64_t>(t, 1));
    Tensor got = Tensor::Zeros({1}, DType::kFloat32);
    if (t > 0) {
      Launch(2, 0, [&] {
        moe::ZLossTermsKernel(logits.data<float>(), t, e, terms.data());
      });
    }
    Launch(1, kThreads * sizeof(double), [&] {
      moe::MeanOfTermsKernel(terms.data(), t, 1e-3f, got.data<float>());
    });
    // The shares are added in another order than the CPU's running sum
    // (float64, rounded once to fp32).
    ExpectNear(got, loss, 1e-7, "loss");

    Tensor dlogits = Random({t, e}, 7);
    Tensor got_dlogits = dlogits.Clone();
    ASSERT_TRUE(MoeZLossBackward(logits, 1e-3f, 0.25f, &dlogits).ok());
    if (t > 0) {
      Launch(2, 0, [&] {
        moe::ZLossBackwardKernel(logits.data<float>(), t, e, 1e-3f, 0.25f,
                                 got_dlogits.data<float>());
      });
    }
    ExpectNear(got_dlogits, dlogits, 1e-6, "dlogits");
  }
}

TEST(MoeExpertBiasEmulatedTest, MatchesTheCpuKernel) {
  const Tensor counts =
      *Tensor::FromInts({5, 9, 7, 7, 0, 14}, {6}, DType::kInt64);
  Tensor bias = Random({6}, 8, DType::kFloat32, -0.1f, 0.1f);
  Tensor got = bias.Clone();
  ASSERT_TRUE(MoeUpdateExpertBias(counts, 0.01f, &bias).ok());
  Launch(1, 0, [&] {
    moe::UpdateExpertBiasKernel(counts.data<int64_t>(), 6, 0.01f,
                                got.data<float>());
  });
  ExpectSame(got, bias, "bias");
}

// k distinct random experts per token, int32.
Tensor RandomIndices(int64_t tokens, int64_t k, int64_t experts,
                     uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> v;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int64_t> e(experts);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), gen);
    v.insert(v.end(), e.begin(), e.begin() + k);
  }
  return *Tensor::FromInts(v, {tokens, k}, DType::kInt32);
}

struct Sorted {
  Tensor row_to_slot, slot_to_row, counts;
};

// The launches of cuda_kernels::MoeSortTokens.
Sorted EmulatedSort(const Tensor& indices, int64_t experts) {
  const int64_t slots = indices.numel();
  Sorted s{Tensor::Zeros({slots}, DType::kInt32),
           Tensor::Zeros({slots}, DType::kInt32),
           Tensor::Zeros({experts}, DType::kInt64)};
  moe::SortParams p;
  p.indices = indices.data<int32_t>();
  p.row_to_slot = s.row_to_slot.data<int32_t>();
  p.slot_to_row = s.slot_to_row.data<int32_t>();
  p.counts = s.counts.data<int64_t>();
  p.slots = slots;
  p.experts = experts;
  const unsigned int blocks = static_cast<unsigned int>(experts);
  Emulator::Launch(Dim3{blocks, 1, 1}, kThreads, kThreads * sizeof(int32_t),
                   [&] { moe::SortCountKernel(p); });
  if (slots == 0) return s;
  Emulator::Launch(Dim3{blocks, 1, 1}, kThreads, kThreads * sizeof(int32_t),
                   [&] { moe::SortScatterKernel(p); });
  Launch(2, 0, [&] { moe::SortMarkInvalidKernel(p); });
  return s;
}

TEST(MoeSortEmulatedTest, MatchesTheCpuKernel) {
  // 150 slots: three chunks of the 64-thread block's scan.
  const int64_t tokens = 50, k = 3, experts = 7;
  const Tensor indices = RandomIndices(tokens, k, experts, 9);
  Tensor r2s = Tensor::Empty({tokens * k}, DType::kInt32);
  Tensor s2r = Tensor::Empty({tokens * k}, DType::kInt32);
  Tensor counts = Tensor::Empty({experts}, DType::kInt64);
  ASSERT_TRUE(MoeSortTokens(indices, experts, &r2s, &s2r, &counts).ok());
  const Sorted got = EmulatedSort(indices, experts);
  ExpectSame(got.row_to_slot, r2s, "row_to_slot");
  ExpectSame(got.slot_to_row, s2r, "slot_to_row");
  ExpectSame(got.counts, counts, "counts");
  // An expert with no slot, and no slots at all.
  const Tensor skewed = *Tensor::FromInts({2, 0, 2, 0}, {2, 2}, DType::kInt32);
  const Sorted s = EmulatedSort(skewed, 3);
  EXPECT_EQ(s.counts.ToDoubles(), (std::vector<double>{2, 0, 2}));
  EXPECT_EQ(s.row_to_slot.ToDoubles(), (std::vector<double>{1, 3, 0, 2}));
  const Sorted none = EmulatedSort(Tensor::Empty({0, 2}, DType::kInt32), 3);
  EXPECT_EQ(none.counts.ToDoubles(), (std::vector<double>{0, 0, 0}));
}

TEST(MoeSortEmulatedTest, AnIndexOutsideTheExpertsGetsNoRow) {
  const Tensor indices = *Tensor::FromInts({1, 5, 0, 1}, {2, 2}, DType::kInt32);
  const Sorted s = EmulatedSort(indices, 3);
  EXPECT_EQ(s.counts.ToDoubles(), (std::vector<double>{1, 2, 0}));
  EXPECT_EQ(s.slot_to_row.ToDoubles(), (std::vector<double>{1, -1, 0, 2}));
  EXPECT_EQ(s.row_to_slot.ToDoubles(), (std::vector<double>{2, 0, 3, -1}));
  // Permuting through the unfilled row gives NaN, not a read out of bounds.
  const Tensor x = Random({2, 3}, 10);
  Tensor permuted = Tensor::Zeros({4, 3}, DType::kFloat32);
  Launch(1, 0, [&] {
    moe::PermuteKernel(x.raw_data(), ElemType::kF32, 4,
                       s.row_to_slot.data<int32_t>(), 4, 2, 3,
                       permuted.raw_data());
  });
  const std::vector<double> v = permuted.ToDoubles();
  EXPECT_EQ(v[0], x.ToDoubles()[3]);  // Slot 2 is token 1.
  EXPECT_TRUE(std::isnan(v[9]) && std::isnan(v[11]));
}

ElemType ElemTypeOf(DType d) {
  return d == DType::kBFloat16  ? ElemType::kBF16
         : d == DType::kFloat16 ? ElemType::kF16
                                : ElemType::kF32;
}

class MoePermuteEmulatedTest : public ::testing::TestWithParam<DType> {};

TEST_P(MoePermuteEmulatedTest, PermutationsMatchTheCpuKernels) {
  const DType dt = GetParam();
  const ElemType et = ElemTypeOf(dt);
  const int esize = dt == DType::kFloat32 ? 4 : 2;
  const int64_t tokens = 23, k = 2, experts = 5, h = 9, rows = tokens * k;
  const Tensor indices = RandomIndices(tokens, k, experts, 11);
  Tensor r2s = Tensor::Empty({rows}, DType::kInt32);
  Tensor s2r = Tensor::Empty({rows}, DType::kInt32);
  Tensor counts = Tensor::Empty({experts}, DType::kInt64);
  ASSERT_TRUE(MoeSortTokens(indices, experts, &r2s, &s2r, &counts).ok());
  const Tensor x = Random({tokens, h}, 12, dt);
  Tensor permuted = Tensor::Empty({rows, h}, dt);
  ASSERT_TRUE(MoePermute(x, r2s, &permuted).ok());
  Tensor got = Tensor::Zeros({rows, h}, dt);
  Launch(2, 0, [&] {
    moe::PermuteKernel(x.raw_data(), et, esize, r2s.data<int32_t>(), rows, k, h,
                       got.raw_data());
  });
  ExpectSame(got, permuted, "permuted");

  const Tensor out = Random({rows, h}, 13, dt);
  const Tensor weights = Random({tokens, k}, 14, DType::kFloat32, 0.0f, 1.0f);
  for (const Tensor* w : {&weights, static_cast<const Tensor*>(nullptr)}) {
    SCOPED_TRACE(w ? "weighted" : "unweighted");
    Tensor y = Tensor::Empty({tokens, h}, dt);
    ASSERT_TRUE(MoeUnpermute(out, s2r, w, &y).ok());
    Tensor got_y = Tensor::Zeros({tokens, h}, dt);
    Launch(2, 0, [&] {
      moe::UnpermuteKernel(out.raw_data(), et, s2r.data<int32_t>(),
                           w ? w->data<float>() : nullptr, tokens, k, h,
                           got_y.raw_data());
    });
    ExpectNear(got_y, y, 1e-6, "y");
  }

  const Tensor dy = Random({tokens, h}, 15, dt);
  Tensor dout = Tensor::Empty({rows, h}, dt);
  Tensor dweights = Tensor::Empty({tokens, k}, DType::kFloat32);
  ASSERT_TRUE(
      MoeUnpermuteBackward(dy, out, s2r, &weights, &dout, &dweights).ok());
  Tensor got_dout = Tensor::Zeros({rows, h}, dt);
  Tensor got_dweights = Tensor::Zeros({tokens, k}, DType::kFloat32);
  Launch(2, 0, [&] {
    moe::UnpermuteBackwardRowsKernel(dy.raw_data(), et, s2r.data<int32_t>(),
                                     weights.data<float>(), rows, k, h,
                                     got_dout.raw_data());
  });
  Launch(2, kThreads * sizeof(double), [&] {
    moe::UnpermuteBackwardWeightsKernel(dy.raw_data(), out.raw_data(), et,
                                        s2r.data<int32_t>(), rows, k, h,
                                        got_dweights.data<float>());
  });
  ExpectSame(got_dout, dout, "dexpert_out");
  // Products of two 16-bit or fp32 values are exact in float64; only the
  // order of the float64 sum differs, then one rounding to fp32.
  ExpectNear(got_dweights, dweights, 1e-7, "dweights");
}

INSTANTIATE_TEST_SUITE_P(DTypes, MoePermuteEmulatedTest,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16,
                                           DType::kFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace ops
}  // namespace mcc
