// Packed documents and sliding windows in the GPT model: the first keys
// attention gets, and a packed sequence of three documents giving each
// document the loss and gradients it gets run alone.
#include "models/gpt/document_mask.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"

namespace mcc {
namespace gpt {
namespace {

std::vector<int64_t> Ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (double d : t.ToDoubles()) out.push_back(static_cast<int64_t>(d));
  return out;
}

TEST(DocumentMaskTest, FirstKeysOfDocumentsAndWindow) {
  Tensor starts =
      *Tensor::FromInts({0, 0, 0, 3, 3, 3, 3, 7}, {1, 8}, DType::kInt32);
  EXPECT_EQ(Ints(*AttentionFirstKeys(starts, 1, 8, -1)),
            (std::vector<int64_t>{0, 0, 0, 3, 3, 3, 3, 7}));
  // Window of 2 keys before the query (3 in all).
  EXPECT_EQ(Ints(*AttentionFirstKeys(starts, 1, 8, 2)),
            (std::vector<int64_t>{0, 0, 0, 3, 3, 3, 4, 7}));
  EXPECT_EQ(Ints(*AttentionFirstKeys(Tensor(), 1, 8, 2)),
            (std::vector<int64_t>{0, 0, 0, 1, 2, 3, 4, 5}));
  EXPECT_FALSE(AttentionFirstKeys(Tensor(), 1, 8, -1)->defined());
}

TEST(DocumentMaskTest, BadDocumentStartsAreRefusedByName) {
  Tensor later = *Tensor::FromInts({0, 2, 0}, {1, 3}, DType::kInt32);
  auto r = AttentionFirstKeys(later, 1, 3, -1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("document_start"), std::string::npos);
  Tensor wide = *Tensor::FromInts({0, 0, 0}, {1, 3});  // int64
  EXPECT_FALSE(AttentionFirstKeys(wide, 1, 3, -1).ok());
}

TEST(DocumentMaskTest, DocumentsStartAfterEachEod) {
  Tensor tokens = *Tensor::FromInts({5, 9, 1, 9, 9, 4}, {1, 6});
  EXPECT_EQ(Ints(DocumentStartsAfterEod(tokens, 9)),
            (std::vector<int64_t>{0, 0, 2, 2, 4, 5}));
}

GPTConfig Tiny(bool llama, int64_t window_left) {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.seq_length = 16;
  c.seed = 5;
  c.window_left = window_left;
  if (llama) {
    c.num_query_groups = 2;
    c.normalization = Normalization::kRMSNorm;
    c.activation = Activation::kSwiGLU;
    c.position_embedding = PositionEmbedding::kRope;
    c.untie_embeddings_and_output_weights = true;
    c.add_bias_linear = false;
  }
  return c;
}

struct Outcome {
  double loss = 0;
  std::vector<std::vector<float>> grads;
};

Outcome Run(GPTModel* model, const MicroBatch& batch) {
  model->ZeroGradients();
  auto loss = model->ForwardBackward(batch, 1.0f);
  EXPECT_TRUE(loss.ok()) << loss.status();
  Outcome o;
  o.loss = loss.ok() ? loss->mean() : NAN;
  for (const auto& p : model->parameters()) {
    o.grads.push_back(p->main_grad.ToFloats());
  }
  return o;
}

double WorstRelative(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
  }
  return diff / std::max(ref, 1e-30);
}

// Documents of 5, 6 and 5 tokens packed into 16: the loss over one
// document's tokens and its gradients equal that document's run alone.
// expect_leak: the packed batch goes without its document starts, so later
// documents see earlier ones (the check's own check).
void CheckEachDocumentAlone(const GPTConfig& config, bool expect_leak) {
  parallel::LayerContext ctx;
  ctx.seed = config.seed;
  auto model = GPTModel::Create(config, ctx);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> lengths = {5, 6, 5};
  std::mt19937 rng(3);
  std::vector<int64_t> tokens(16), labels(16), starts, positions;
  for (auto& t : tokens) t = rng() % config.vocab_size;
  for (auto& l : labels) l = rng() % config.vocab_size;
  int64_t start = 0;
  for (int64_t n : lengths) {
    for (int64_t t = 0; t < n; ++t) {
      starts.push_back(start);
      positions.push_back(t);
    }
    start += n;
  }
  MicroBatch packed;
  packed.tokens = *Tensor::FromInts(tokens, {1, 16});
  packed.labels = *Tensor::FromInts(labels, {1, 16});
  if (!expect_leak) {
    packed.document_start = *Tensor::FromInts(starts, {1, 16}, DType::kInt32);
  }
  packed.position_ids = *Tensor::FromInts(positions, {1, 16});
  double worst_loss = 0, worst_grad = 0;
  start = 0;
  for (int64_t n : lengths) {
    std::vector<float> mask(16, 0.0f);
    for (int64_t t = start; t < start + n; ++t) mask[t] = 1.0f;
    packed.loss_mask = *Tensor::FromVector(mask, {1, 16});
    const Outcome a = Run(model->get(), packed);
    MicroBatch alone;
    alone.tokens =
        *Tensor::FromInts(std::vector<int64_t>(tokens.begin() + start,
                                               tokens.begin() + start + n),
                          {1, n});
    alone.labels =
        *Tensor::FromInts(std::vector<int64_t>(labels.begin() + start,
                                               labels.begin() + start + n),
                          {1, n});
    const Outcome b = Run(model->get(), alone);
    worst_loss = std::max(worst_loss, std::fabs(a.loss - b.loss) / b.loss);
    for (size_t i = 0; i < a.grads.size(); ++i) {
      worst_grad = std::max(worst_grad, WorstRelative(a.grads[i], b.grads[i]));
    }
    start += n;
  }
  std::printf("worst relative loss difference %.3g, gradient %.3g\n",
              worst_loss, worst_grad);
  if (expect_leak) {
    // Without the document mask later documents see earlier ones.
    EXPECT_GT(worst_loss, 1e-4);
  } else {
    EXPECT_LE(worst_loss, 1e-6);
    EXPECT_LE(worst_grad, 2e-6);
  }
}

TEST(DocumentMaskTest, EachDocumentAsIfAloneLearnedPositions) {
  CheckEachDocumentAlone(Tiny(false, -1), false);
}

TEST(DocumentMaskTest, EachDocumentAsIfAloneLlama) {
  CheckEachDocumentAlone(Tiny(true, -1), false);
}

TEST(DocumentMaskTest, EachDocumentAsIfAloneLlamaWithWindow) {
  CheckEachDocumentAlone(Tiny(true, 2), false);
}

TEST(DocumentMaskTest, WithoutDocumentStartsDocumentsLeak) {
  CheckEachDocumentAlone(Tiny(true, -1), true);
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
