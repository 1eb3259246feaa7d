// The expert bias balances a skewed router (issue 41, DeepSeek-V3's
// aux-loss-free balancing): a GPT whose MoE router strongly prefers expert
// 0, its weights frozen, routes evenly after 50 bias steps; without the
// bias it stays skewed. Also: the model's MoE stats count every routed
// token once per choice.
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"

namespace mcc {
namespace gpt {
namespace {

GPTConfig MoeConfig(bool expert_bias) {
  GPTConfig c;
  c.num_layers = 1;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.seq_length = 32;
  c.add_bias_linear = false;
  c.activation = Activation::kSwiGLU;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 16;
  c.moe_router_enable_expert_bias = expert_bias;
  c.moe_router_bias_update_rate = 2e-2;
  return c;
}

MicroBatch Batch(const GPTConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> tokens(4 * c.seq_length);
  for (auto& t : tokens) t = rng() % c.vocab_size;
  MicroBatch b;
  b.tokens = *Tensor::FromInts(tokens, {4, c.seq_length});
  b.labels = b.tokens;
  return b;
}

// The largest expert load over the mean (1: even; 2: one expert takes
// every token's first choice).
double MaxOverMean(const std::vector<int64_t>& tokens) {
  int64_t total = 0, most = 0;
  for (int64_t t : tokens) {
    total += t;
    most = std::max(most, t);
  }
  return static_cast<double>(most) * tokens.size() / total;
}

// Max/mean load of the first step and of the last 10 of 50.
std::pair<double, double> LoadBeforeAndAfter(bool expert_bias) {
  const GPTConfig c = MoeConfig(expert_bias);
  parallel::LayerContext ctx;
  auto model = *GPTModel::Create(c, ctx);
  // Skew: the MLP's norm adds a constant vector of ones to every token's
  // (zero-mean) hidden state, and the router's row for expert 0 reads it,
  // so every token's logit for expert 0 rises by 0.5.
  for (const auto& p : model->parameters()) {
    if (p->name != "decoder.layers.0.pre_mlp_layernorm.bias") continue;
    float* b = p->value.data<float>();
    for (int64_t j = 0; j < c.hidden_size; ++j) b[j] = 1.0f;
  }
  Parameter& router = model->layer(0)->moe()->router_weight();
  float* w = router.value.data<float>();
  for (int64_t j = 0; j < c.hidden_size; ++j) {
    w[j] += 0.5f / static_cast<float>(c.hidden_size);
  }
  std::vector<int64_t> first(c.num_experts, 0), last(c.num_experts, 0);
  for (int step = 0; step < 50; ++step) {
    model->ZeroGradients();
    EXPECT_TRUE(model->ForwardBackward(Batch(c, step % 7), 1.0f).ok());
    EXPECT_TRUE(model->UpdateExpertBias(nullptr).ok());
    auto stats = model->TakeMoeStats();
    EXPECT_TRUE(stats.ok() && stats->size() == 1u);
    const std::vector<int64_t>& t = (*stats)[0].tokens_per_expert;
    int64_t routed = 0;
    for (int e = 0; e < c.num_experts; ++e) {
      routed += t[e];
      if (step == 0) first[e] += t[e];
      if (step >= 40) last[e] += t[e];
    }
    // Every token's two choices, once each.
    EXPECT_EQ(routed, 4 * c.seq_length * c.moe_router_topk);
  }
  return {MaxOverMean(first), MaxOverMean(last)};
}

TEST(MoeBalanceTest, ExpertBiasEvensOutASkewedRouterIn50Steps) {
  const auto [skewed, balanced] = LoadBeforeAndAfter(/*expert_bias=*/true);
  // The first step routes nearly every token to expert 0 (max/mean near 2);
  // the last ten are within 15% of even.
  EXPECT_GT(skewed, 1.6);
  EXPECT_LT(balanced, 1.15);
  const auto [before, after] = LoadBeforeAndAfter(/*expert_bias=*/false);
  std::printf(
      "max/mean load: with the bias %.3f -> %.3f, without %.3f -> %.3f\n",
      skewed, balanced, before, after);
  EXPECT_GT(before, 1.6);
  EXPECT_GT(after, 1.6);  // The router's weights never changed.
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
