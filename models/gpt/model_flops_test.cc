#include "models/gpt/model_flops.h"

#include "gtest/gtest.h"

namespace mcc {
namespace gpt {
namespace {

// Megatron's count (Narayanan et al. 2021): 72 L h^2 (1 + s / 6h +
// V / 12 h L) FLOPs a token for ffn 4h, GeLU, no GQA.
TEST(ModelFlopsTest, MatchesMegatronsFormula) {
  GPTConfig c;
  c.num_layers = 8;
  c.hidden_size = 1024;
  c.num_attention_heads = 16;
  c.vocab_size = 32000;
  c.seq_length = 2048;
  const double L = 8, h = 1024, s = 2048, V = 32000;
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(c),
                   72 * L * h * h * (1 + s / (6 * h) + V / (12 * h * L)));
}

// GQA shrinks K and V to the query groups; SwiGLU doubles the MLP's input
// GEMM: 6 (L (h (h + 2 kv) + h^2 + 3 h f + 2 s h) + h V).
TEST(ModelFlopsTest, CountsGroupedQueriesAndSwiGlu) {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.num_query_groups = 2;  // kv = 2 groups x head_dim 8 = 16.
  c.ffn_hidden_size = 96;
  c.activation = Activation::kSwiGLU;
  c.vocab_size = 100;
  c.seq_length = 32;
  const double per_layer =
      64.0 * (64 + 2 * 16) + 64.0 * 64 + 3 * 64.0 * 96 + 2 * 32.0 * 64;
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(c), 6 * (2 * per_layer + 64.0 * 100));
}

// An MoE layer counts its top-k experts and its shared expert; a dense layer
// its MLP.
TEST(ModelFlopsTest, CountsTheActiveExpertsOfMoeLayers) {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.ffn_hidden_size = 96;
  c.activation = Activation::kSwiGLU;
  c.vocab_size = 100;
  c.seq_length = 32;
  c.num_experts = 8;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 40;
  c.moe_shared_expert_intermediate_size = 24;
  c.moe_layer_freq = "[0,1]";
  const double attention = 64.0 * (64 + 2 * 64) + 64.0 * 64 + 2 * 32.0 * 64;
  const double dense = 3 * 64.0 * 96;
  const double moe = 2 * 3 * 64.0 * 40 + 3 * 64.0 * 24;
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(c),
                   6 * (2 * attention + dense + moe + 64.0 * 100));
}

// Pairs counted by hand: query i of a document starting at d sees i - d + 1
// keys, at most window_left + 1.
TEST(ModelFlopsTest, CountsTheAttentionPairsDocumentsAndWindowsNeed) {
  EXPECT_EQ(FullCausalAttentionPairs(1, 8), 36);
  EXPECT_EQ(CausalAttentionPairs(nullptr, 2, 8, -1), 72);
  // Documents [0, 3) and [3, 8): 1+2+3 + 1+2+3+4+5.
  const int32_t two_docs[8] = {0, 0, 0, 3, 3, 3, 3, 3};
  EXPECT_EQ(CausalAttentionPairs(two_docs, 1, 8, -1), 21);
  // A window of 2 keys back: 1, 2, then 3 for each of the other six.
  EXPECT_EQ(CausalAttentionPairs(nullptr, 1, 8, 2), 21);
  // Documents [0, 5) and [5, 8) under a window of 1: 1+2+2+2+2 + 1+2+2.
  const int32_t docs_window[8] = {0, 0, 0, 0, 0, 5, 5, 5};
  EXPECT_EQ(CausalAttentionPairs(docs_window, 1, 8, 1), 14);
  // Two sequences: each its own.
  const int32_t both[16] = {0, 0, 0, 3, 3, 3, 3, 3, 0, 0, 0, 0, 0, 5, 5, 5};
  EXPECT_EQ(CausalAttentionPairs(both, 2, 8, -1), 21 + 15 + 6);
}

// The attention term (6 x 2 s h a layer) scales with the pairs computed;
// the GEMMs and the output layer do not.
TEST(ModelFlopsTest, ScalesOnlyTheAttentionTerm) {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.vocab_size = 100;
  c.seq_length = 8;
  const double attention = 6 * 2 * (2 * 8.0 * 64);  // 12288 a token.
  EXPECT_DOUBLE_EQ(AttentionTrainingFlopsPerToken(c), attention);
  const double full = TrainingFlopsPerToken(c);
  EXPECT_DOUBLE_EQ(TrainingFlops(c, 16, 1.0), 16 * full);
  // Two documents of 3 and 5 tokens: 21 of the 36 causal pairs.
  EXPECT_DOUBLE_EQ(TrainingFlops(c, 16, 21.0 / 36),
                   16 * (full - attention + attention * 21 / 36));
  EXPECT_DOUBLE_EQ(TrainingFlops(c, 16, 0.0), 16 * (full - attention));
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
