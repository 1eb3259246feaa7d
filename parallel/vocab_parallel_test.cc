// Vocabulary padding never takes probability: cross entropy over padded
// logits equals cross entropy over the true vocabulary, and the padding
// columns get zero gradient, whatever values they hold.
#include "parallel/vocab_parallel.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace parallel {
namespace {

// Logits [tokens, cols]: the first `vocab` columns as `base` holds them,
// the rest (padding) set to `pad`.
Tensor Padded(const std::vector<float>& base, int64_t tokens, int64_t vocab,
              int64_t cols, float pad) {
  std::vector<float> v(tokens * cols, pad);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < vocab; ++j) v[t * cols + j] = base[t * vocab + j];
  }
  return *Tensor::FromVector(v, {tokens, cols});
}

TEST(VocabParallelCrossEntropyTest, PaddedColumnsTakeNoProbability) {
  constexpr int64_t kTokens = 6, kVocab = 11;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> base(kTokens * kVocab);
  for (float& x : base) x = normal(rng);
  std::vector<int64_t> y = {0, 10, 3, -100, 7, 10};
  Tensor targets = *Tensor::FromInts(y, {kTokens});
  Tensor dloss = Tensor::Full({kTokens}, 0.25, DType::kFloat32);

  VocabParallelCrossEntropy::Activations act;
  auto ref = VocabParallelCrossEntropy::Forward(
      nullptr, Padded(base, kTokens, kVocab, kVocab, 0), targets, 0, kVocab,
      &act);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto ref_grad =
      VocabParallelCrossEntropy::Backward(dloss, act, DType::kFloat32);
  ASSERT_TRUE(ref_grad.ok()) << ref_grad.status();
  // The loss against float64 on the true vocabulary.
  for (int64_t t = 0; t < kTokens; ++t) {
    if (y[t] == -100) {
      EXPECT_EQ(ref->data<float>()[t], 0.0f);
      continue;
    }
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < kVocab; ++j)
      m = std::max<double>(m, base[t * kVocab + j]);
    for (int64_t j = 0; j < kVocab; ++j)
      s += std::exp(base[t * kVocab + j] - m);
    EXPECT_NEAR(ref->data<float>()[t],
                m + std::log(s) - base[t * kVocab + y[t]], 1e-5);
  }
  // Padding to 16 columns with zeros, with huge values (a padded token
  // would otherwise take all the probability) and with -inf-like ones.
  for (float pad : {0.0f, 1e4f, -1e4f}) {
    SCOPED_TRACE(pad);
    constexpr int64_t kCols = 16;
    VocabParallelCrossEntropy::Activations pact;
    auto loss = VocabParallelCrossEntropy::Forward(
        nullptr, Padded(base, kTokens, kVocab, kCols, pad), targets, 0, kVocab,
        &pact);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_EQ(loss->ToFloats(), ref->ToFloats());
    auto grad =
        VocabParallelCrossEntropy::Backward(dloss, pact, DType::kFloat32);
    ASSERT_TRUE(grad.ok()) << grad.status();
    for (int64_t t = 0; t < kTokens; ++t) {
      for (int64_t j = 0; j < kCols; ++j) {
        const float g = grad->data<float>()[t * kCols + j];
        if (j < kVocab) {
          EXPECT_EQ(g, ref_grad->data<float>()[t * kVocab + j])
              << t << "," << j;
        } else {
          EXPECT_EQ(g, 0.0f) << "padding column " << j << " of token " << t;
        }
      }
    }
  }
  // A target in the padding is out of the vocabulary.
  VocabParallelCrossEntropy::Activations bad_act;
  auto bad = VocabParallelCrossEntropy::Forward(
      nullptr, Padded(base, kTokens, kVocab, 16, 0),
      *Tensor::FromInts({0, 12, 0, 0, 0, 0}, {kTokens}), 0, kVocab, &bad_act);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("outside the vocabulary of 11"),
            std::string::npos)
      << bad.status();
}

TEST(VocabParallelEmbeddingTest, PaddingRowsAreZeroAndTheRestDoNotDependOnIt) {
  LayerContext ctx;
  ctx.seed = 5;
  const InitSpec init = InitSpec::Normal(0.02f);
  auto exact = VocabParallelEmbedding::Create("w", 11, 11, 4, init, ctx);
  auto padded = VocabParallelEmbedding::Create("w", 11, 16, 4, init, ctx);
  ASSERT_TRUE(exact.ok() && padded.ok());
  const std::vector<float> a = (*exact)->weight()->value.ToFloats();
  const std::vector<float> b = (*padded)->weight()->value.ToFloats();
  ASSERT_EQ(b.size(), 16u * 4);
  EXPECT_EQ(std::vector<float>(b.begin(), b.begin() + 44), a);
  for (size_t i = 44; i < b.size(); ++i) EXPECT_EQ(b[i], 0.0f) << i;
  EXPECT_EQ((*padded)->weight()->unpadded_rows, 11);
  EXPECT_EQ((*exact)->weight()->model_rows(), 11);
}

}  // namespace
}  // namespace parallel
}  // namespace mcc
