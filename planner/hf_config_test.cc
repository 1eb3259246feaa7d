#include "planner/hf_config.h"

#include "gtest/gtest.h"
#include "planner/param_count.h"

namespace mcc {
namespace planner {
namespace {

// Llama 3 8B's published config.json (the fields the planner reads).
constexpr char kLlama3_8B[] = R"({
  "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
  "num_attention_heads": 32, "num_key_value_heads": 8,
  "intermediate_size": 14336, "max_position_embeddings": 8192,
  "vocab_size": 128256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "tie_word_embeddings": false})";

TEST(HfConfigTest, Llama3EightBillion) {
  auto c = GPTConfigFromHuggingFace(kLlama3_8B, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->query_groups(), 8);
  EXPECT_EQ(c->activation, gpt::Activation::kSwiGLU);
  EXPECT_TRUE(c->untie_embeddings_and_output_weights);
  // Meta's model card: 8.03B parameters.
  EXPECT_NEAR(ModelParams(*c) / 1e9, 8.03, 0.005);
}

// Mixtral 8x7B's published config.json: 46.7B parameters, every layer 8
// experts of 14336, top-2.
TEST(HfConfigTest, Mixtral8x7B) {
  auto c = GPTConfigFromHuggingFace(
      R"({"model_type": "mixtral", "num_hidden_layers": 32,
          "hidden_size": 4096, "num_attention_heads": 32,
          "num_key_value_heads": 8, "intermediate_size": 14336,
          "max_position_embeddings": 32768, "vocab_size": 32000,
          "num_local_experts": 8, "num_experts_per_tok": 2,
          "tie_word_embeddings": false})",
      "mixtral.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->moe_router_topk, 2);
  EXPECT_EQ(c->moe_ffn(), 14336);
  EXPECT_TRUE(c->IsMoeLayer(0) && c->IsMoeLayer(31));
  EXPECT_TRUE(c->Validate(1, false).ok()) << c->Validate(1, false);
  EXPECT_NEAR(ModelParams(*c) / 1e9, 46.70, 0.01);
}

// Qwen1.5-MoE-A2.7B (qwen2_moe): 60 experts of 1408, top-4, a shared
// expert of 5632; 14.3B parameters.
TEST(HfConfigTest, Qwen2MoeA27B) {
  const std::string base =
      R"("model_type": "qwen2_moe", "num_hidden_layers": 24,
         "hidden_size": 2048, "num_attention_heads": 16,
         "num_key_value_heads": 16, "intermediate_size": 5632,
         "max_position_embeddings": 8192, "vocab_size": 151936,
         "num_experts": 60, "num_experts_per_tok": 4,
         "moe_intermediate_size": 1408,
         "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
         "tie_word_embeddings": false)";
  auto c = GPTConfigFromHuggingFace("{" + base + "}", "qwen.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_experts, 60);
  EXPECT_EQ(c->moe_router_topk, 4);
  EXPECT_EQ(c->moe_ffn(), 1408);
  EXPECT_EQ(c->moe_shared_expert_intermediate_size, 5632);
  EXPECT_NEAR(ModelParams(*c) / 1e9, 14.3, 0.02);
  // Every second layer (1, 3) less the dense-only layer 1.
  auto step2 = GPTConfigFromHuggingFace(
      R"({"model_type": "qwen3_moe", "num_hidden_layers": 4,
          "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
          "intermediate_size": 128, "max_position_embeddings": 32,
          "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 32, "decoder_sparse_step": 2,
          "mlp_only_layers": [1]})",
      "qwen3.json");
  ASSERT_TRUE(step2.ok()) << step2.status();
  EXPECT_EQ(step2->moe_layer_freq, "[0,0,0,1]");
  // Refused by name: a head_dim the planner cannot hold, missing experts.
  auto head = GPTConfigFromHuggingFace(
      R"({"model_type": "qwen3_moe", "num_hidden_layers": 2,
          "hidden_size": 64, "num_attention_heads": 4, "head_dim": 32,
          "intermediate_size": 128, "max_position_embeddings": 32,
          "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 32})",
      "q.json");
  ASSERT_FALSE(head.ok());
  EXPECT_NE(head.status().message().find("head_dim"), std::string::npos);
  auto missing = GPTConfigFromHuggingFace(
      R"({"model_type": "mixtral", "num_hidden_layers": 2,
          "hidden_size": 64, "num_attention_heads": 4,
          "intermediate_size": 128, "max_position_embeddings": 32,
          "vocab_size": 100, "num_experts_per_tok": 2})",
      "m.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("num_local_experts"),
            std::string::npos);
}

TEST(HfConfigTest, Gpt2Small) {
  auto c = GPTConfigFromHuggingFace(
      R"({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
          "n_positions": 1024, "vocab_size": 50257})",
      "gpt2.json");
  ASSERT_TRUE(c.ok()) << c.status();
  // GPT-2 small: 124.4M parameters (tied embeddings).
  EXPECT_NEAR(ModelParams(*c) / 1e6, 124.44, 0.01);
  EXPECT_EQ(c->seq_length, 1024);
}

TEST(HfConfigTest, ErrorsNameTheFileAndField) {
  auto c = GPTConfigFromHuggingFace(R"({"model_type": "gpt2", "n_layer": 2})",
                                    "x.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("x.json"), std::string::npos);
  EXPECT_NE(c.status().message().find("n_embd"), std::string::npos);
  EXPECT_FALSE(GPTConfigFromHuggingFace("{", "y.json").ok());
  EXPECT_FALSE(GPTConfigFromHuggingFace(R"({"model_type": "t5"})", "z").ok());
}

// Members of the wrong type threw nlohmann's type_error out of value(),
// aborting the planner.
TEST(HfConfigTest, WrongTypedFieldsNameTheFileAndField) {
  const std::string gpt2 =
      R"("n_layer": 2, "n_embd": 8, "n_head": 2, "n_positions": 16, )"
      R"("vocab_size": 32)";
  const std::string llama =
      R"("num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2, )"
      R"("intermediate_size": 16, "max_position_embeddings": 16, )"
      R"("vocab_size": 32)";
  struct Case {
    std::string json;
    std::string want;
  } cases[] = {
      {R"({"model_type": 2})", "\"model_type\" must be a string"},
      {R"({"model_type": "gpt2", )" + gpt2 + R"(, "tie_word_embeddings": 1})",
       "\"tie_word_embeddings\" must be true or false"},
      {R"({"model_type": "gpt2", )" + gpt2 + R"(, "n_inner": "64"})",
       "\"n_inner\" must be an integer"},
      {R"({"model_type": "llama", )" + llama +
           R"(, "num_key_value_heads": "2"})",
       "\"num_key_value_heads\" must be an integer"},
      {R"({"model_type": "llama", )" + llama +
           R"(, "tie_word_embeddings": "no"})",
       "\"tie_word_embeddings\" must be true or false"},
      {R"({"model_type": "gpt2", "n_layer": 2.5, "n_embd": 8})",
       "\"n_layer\" must be an integer"},
      {R"({"model_type": "gpt2", "n_layer": 4294967296, "n_embd": 8})",
       "\"n_layer\" is 4294967296, not in [1, 2147483647]"},
      {R"({"model_type": "llama", "num_hidden_layers": 0})",
       "\"num_hidden_layers\" is 0"},
  };
  for (const Case& c : cases) {
    auto config = GPTConfigFromHuggingFace(c.json, "config.json");
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_NE(config.status().message().find("config.json: "),
              std::string::npos)
        << config.status();
    EXPECT_NE(config.status().message().find(c.want), std::string::npos)
        << config.status();
  }
  // n_inner null (Hugging Face's default) means 4 x hidden.
  auto ok = GPTConfigFromHuggingFace(
      R"({"model_type": "gpt2", )" + gpt2 + R"(, "n_inner": null})", "c");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->ffn_hidden_size, 0);
}

}  // namespace
}  // namespace planner
}  // namespace mcc
