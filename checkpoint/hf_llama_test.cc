#include "checkpoint/hf_llama.h"

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/hf_common.h"
#include "checkpoint/in_process_group.h"
#include "checkpoint/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using testing_util::RandomTensor;

// 4 query heads of size 3 over 2 K/V groups, vocabulary 11 padded to 16.
checkpoint::ModelConfig SmallConfig(bool tied) {
  checkpoint::ModelConfig c;
  c.set_num_layers(2);
  c.set_hidden_size(12);
  c.set_num_attention_heads(4);
  c.set_num_query_groups(2);
  c.set_ffn_hidden_size(10);
  c.set_padded_vocab_size(16);
  c.set_vocab_size(11);
  c.set_max_position_embeddings(7);
  c.set_seq_length(7);
  c.set_position_embedding_type(checkpoint::POSITION_EMBEDDING_ROPE);
  c.set_normalization(checkpoint::NORMALIZATION_RMS_NORM);
  c.set_activation(checkpoint::ACTIVATION_SWIGLU);
  c.set_add_bias_linear(false);
  c.set_tied_embeddings(tied);
  c.set_layernorm_epsilon(1e-6);
  c.set_rotary_base(500000.0);
  return c;
}

// Random parameters; the vocabulary padding rows are zero, as models keep
// them.
std::map<std::string, Tensor> RandomParams(const checkpoint::ModelConfig& c) {
  const int64_t h = c.hidden_size(), f = c.ffn_hidden_size(),
                v = c.padded_vocab_size(), d = h / c.num_attention_heads();
  const int64_t qkv = (c.num_attention_heads() + 2 * c.num_query_groups()) * d;
  std::map<std::string, Tensor> p;
  uint32_t seed = 1;
  auto add = [&](const std::string& name, Shape shape) {
    p[name] = RandomTensor(shape, DType::kFloat32, seed++);
  };
  auto add_vocab = [&](const std::string& name) {
    Tensor t = RandomTensor({v, h}, DType::kFloat32, seed++);
    float* x = t.data<float>();
    for (int64_t i = c.vocab_size() * h; i < v * h; ++i) x[i] = 0;
    p[name] = t;
  };
  add_vocab("embedding.word_embeddings.weight");
  for (int i = 0; i < c.num_layers(); ++i) {
    const std::string l = absl::StrCat("decoder.layers.", i, ".");
    add(l + "input_layernorm.weight", {h});
    add(l + "self_attention.linear_qkv.weight", {qkv, h});
    if (c.add_qkv_bias()) add(l + "self_attention.linear_qkv.bias", {qkv});
    if (c.qk_layernorm()) {
      add(l + "self_attention.q_layernorm.weight", {d});
      add(l + "self_attention.k_layernorm.weight", {d});
    }
    add(l + "self_attention.linear_proj.weight", {h, h});
    add(l + "pre_mlp_layernorm.weight", {h});
    // The stored pattern "[1,0,...]": character 1 + 2i is layer i's.
    if (c.num_experts() > 0 && c.moe_layer_pattern()[1 + 2 * i] == '1') {
      const int64_t e = c.num_experts(), fm = c.moe_ffn_hidden_size();
      add(l + "mlp.router.weight", {e, h});
      add(l + "mlp.experts.linear_fc1.weight", {e, 2 * fm, h});
      add(l + "mlp.experts.linear_fc2.weight", {e, h, fm});
      if (const int64_t fs = c.moe_shared_expert_intermediate_size(); fs > 0) {
        add(l + "mlp.shared_experts.linear_fc1.weight", {2 * fs, h});
        add(l + "mlp.shared_experts.linear_fc2.weight", {h, fs});
        add(l + "mlp.shared_experts.gate_weight", {1, h});
      }
      continue;
    }
    add(l + "mlp.linear_fc1.weight", {2, f, h});
    add(l + "mlp.linear_fc2.weight", {h, f});
  }
  add("decoder.final_layernorm.weight", {h});
  if (!c.tied_embeddings()) add_vocab("output_layer.weight");
  return p;
}

const Tensor& Get(const NamedTensors& t, const std::string& name) {
  for (const auto& [n, x] : t) {
    if (n == name) return x;
  }
  ADD_FAILURE() << "missing " << name;
  static Tensor empty;
  return empty;
}

// Rows [first, first + n) of a 2-d tensor, as doubles.
std::vector<double> Rows(const Tensor& t, int64_t first, int64_t n) {
  const std::vector<double> all = t.ToDoubles();
  const int64_t cols = t.numel() / t.size(0);
  return std::vector<double>(all.begin() + first * cols,
                             all.begin() + (first + n) * cols);
}

TEST(HfLlamaTest, ExportSplitsEachGroupsHeadsAndTheSwiGLUHalves) {
  const auto config = SmallConfig(/*tied=*/false);
  const auto params = RandomParams(config);
  auto hf = ExportLlama(params, config);
  ASSERT_TRUE(hf.ok()) << hf.status();
  // Layer 1: our rows per group g are [q heads 2g, 2g + 1 | k_g | v_g].
  const Tensor& fused =
      params.at("decoder.layers.1.self_attention.linear_qkv.weight");
  const Tensor& q = Get(*hf, "model.layers.1.self_attn.q_proj.weight");
  const Tensor& k = Get(*hf, "model.layers.1.self_attn.k_proj.weight");
  const Tensor& v = Get(*hf, "model.layers.1.self_attn.v_proj.weight");
  ASSERT_EQ(q.shape(), (Shape{12, 12}));
  ASSERT_EQ(k.shape(), (Shape{6, 12}));
  ASSERT_EQ(v.shape(), (Shape{6, 12}));
  const int64_t d = 3;
  for (int64_t head = 0; head < 4; ++head) {
    const int64_t g = head / 2, j = head % 2;
    EXPECT_EQ(Rows(q, head * d, d), Rows(fused, (g * 4 + j) * d, d))
        << "query head " << head;
  }
  for (int64_t g = 0; g < 2; ++g) {
    EXPECT_EQ(Rows(k, g * d, d), Rows(fused, (g * 4 + 2) * d, d)) << g;
    EXPECT_EQ(Rows(v, g * d, d), Rows(fused, (g * 4 + 3) * d, d)) << g;
  }
  // SwiGLU: our [0] goes through SiLU (the gate), [1] is the up projection.
  const Tensor& fc1 = params.at("decoder.layers.0.mlp.linear_fc1.weight");
  const auto fc1v = fc1.ToDoubles();
  const auto gate = Get(*hf, "model.layers.0.mlp.gate_proj.weight").ToDoubles();
  const auto up = Get(*hf, "model.layers.0.mlp.up_proj.weight").ToDoubles();
  ASSERT_EQ(gate.size() * 2, fc1v.size());
  EXPECT_EQ(gate,
            std::vector<double>(fc1v.begin(), fc1v.begin() + fc1v.size() / 2));
  EXPECT_EQ(up,
            std::vector<double>(fc1v.begin() + fc1v.size() / 2, fc1v.end()));
  // The vocabulary without its padding; the untied head exported.
  EXPECT_EQ(Get(*hf, "model.embed_tokens.weight").shape(), (Shape{11, 12}));
  EXPECT_EQ(Get(*hf, "lm_head.weight").shape(), (Shape{11, 12}));
  EXPECT_EQ(
      Get(*hf, "model.layers.0.post_attention_layernorm.weight").ToDoubles(),
      params.at("decoder.layers.0.pre_mlp_layernorm.weight").ToDoubles());
  EXPECT_EQ(hf->size(), 2u + 2 * 9 + 1);
}

TEST(HfLlamaTest, ImportInvertsExportExactly) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const auto config = SmallConfig(tied);
    const auto params = RandomParams(config);
    auto hf = ExportLlama(params, config);
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_EQ(hf->size(), (tied ? 1u : 2u) + 2 * 9 + 1);
    auto back = ImportLlama(*hf, config);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->size(), params.size());
    for (const auto& [name, t] : params) {
      ASSERT_TRUE(back->count(name)) << name;
      EXPECT_EQ(back->at(name).shape(), t.shape()) << name;
      EXPECT_EQ(back->at(name).ToDoubles(), t.ToDoubles()) << name;
    }
  }
}

checkpoint::ModelConfig Qwen2Config(bool tied) {
  checkpoint::ModelConfig c = SmallConfig(tied);
  c.set_add_qkv_bias(true);
  return c;
}

TEST(HfLlamaTest, Qwen2QkvBiasSplitsAsTheWeightsRowsAndRoundTrips) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const auto config = Qwen2Config(tied);
    EXPECT_TRUE(CheckLlamaCompatible(config).ok());
    EXPECT_EQ(HfArchitecture(config), "Qwen2ForCausalLM");
    const auto params = RandomParams(config);
    auto hf = ExportLlama(params, config);
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_EQ(hf->size(), (tied ? 1u : 2u) + 2 * 12 + 1);
    const std::vector<double> fused =
        params.at("decoder.layers.1.self_attention.linear_qkv.bias")
            .ToDoubles();
    const auto q = Get(*hf, "model.layers.1.self_attn.q_proj.bias").ToDoubles();
    const auto k = Get(*hf, "model.layers.1.self_attn.k_proj.bias").ToDoubles();
    const auto v = Get(*hf, "model.layers.1.self_attn.v_proj.bias").ToDoubles();
    ASSERT_EQ(q.size(), 12u);
    ASSERT_EQ(k.size(), 6u);
    ASSERT_EQ(v.size(), 6u);
    const int64_t d = 3;
    for (int64_t head = 0; head < 4; ++head) {
      const int64_t g = head / 2, j = head % 2;
      for (int64_t e = 0; e < d; ++e) {
        EXPECT_EQ(q[head * d + e], fused[(g * 4 + j) * d + e]) << head;
      }
    }
    for (int64_t g = 0; g < 2; ++g) {
      for (int64_t e = 0; e < d; ++e) {
        EXPECT_EQ(k[g * d + e], fused[(g * 4 + 2) * d + e]) << g;
        EXPECT_EQ(v[g * d + e], fused[(g * 4 + 3) * d + e]) << g;
      }
    }
    auto back = ImportLlama(*hf, config);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->size(), params.size());
    for (const auto& [name, t] : params) {
      ASSERT_TRUE(back->count(name)) << name;
      EXPECT_EQ(back->at(name).ToDoubles(), t.ToDoubles()) << name;
    }
  }
}

TEST(HfLlamaTest, ParsesAQwen25ConfigAndWritesQwen2Back) {
  const std::string qwen = R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
    "num_key_value_heads": 2, "num_hidden_layers": 24, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "vocab_size": 151936,
    "max_position_embeddings": 32768, "sliding_window": 32768,
    "max_window_layers": 21, "use_sliding_window": false,
    "tie_word_embeddings": true, "hidden_act": "silu",
    "torch_dtype": "bfloat16"})";
  auto c = ParseLlamaConfigJson(qwen, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->add_qkv_bias());
  EXPECT_FALSE(c->add_bias_linear());
  EXPECT_TRUE(c->tied_embeddings());
  EXPECT_EQ(c->rotary_base(), 1000000.0);
  const std::string text = LlamaConfigJson(*c, DType::kBFloat16);
  EXPECT_TRUE(absl::StrContains(text, "\"Qwen2ForCausalLM\"")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\"model_type\": \"qwen2\"")) << text;
  auto again = ParseLlamaConfigJson(text, "again.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->DebugString(), c->DebugString());
  std::string sliding = qwen;
  sliding.replace(sliding.find("\"use_sliding_window\": false"), 27,
                  "\"use_sliding_window\": true");
  EXPECT_NE(ParseLlamaConfigJson(sliding, "s.json")
                .status()
                .message()
                .find("\"use_sliding_window\""),
            std::string::npos);
  std::string other = qwen;
  other.replace(other.find("\"qwen2\""), 7, "\"gemma\"");
  EXPECT_NE(ParseLlamaConfigJson(other, "o.json")
                .status()
                .message()
                .find("\"gemma\""),
            std::string::npos);
}

TEST(HfLlamaTest, MistralSlidingWindowMapsAndRoundTrips) {
  checkpoint::ModelConfig config = SmallConfig(/*tied=*/false);
  config.set_sliding_window(3);
  EXPECT_TRUE(CheckLlamaCompatible(config).ok());
  EXPECT_EQ(HfArchitecture(config), "MistralForCausalLM");
  const auto params = RandomParams(config);
  auto hf = ExportLlama(params, config);
  ASSERT_TRUE(hf.ok()) << hf.status();
  auto back = ImportLlama(*hf, config);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), params.size());
  for (const auto& [name, t] : params) {
    ASSERT_TRUE(back->count(name)) << name;
    EXPECT_EQ(back->at(name).ToDoubles(), t.ToDoubles()) << name;
  }
  // Qwen's windows stay refused, as does rope_scaling with a window.
  checkpoint::ModelConfig qwen = config;
  qwen.set_add_qkv_bias(true);
  EXPECT_NE(CheckLlamaCompatible(qwen).message().find("use_sliding_window"),
            std::string::npos);
  checkpoint::ModelConfig scaled = config;
  scaled.mutable_rope_scaling()->set_rope_type("llama3");
  EXPECT_NE(CheckLlamaCompatible(scaled).message().find("rope_scaling"),
            std::string::npos);
}

TEST(HfLlamaTest, ParsesAMistralConfigAndWritesMistralBack) {
  const std::string mistral = R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral",
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768,
    "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "sliding_window": 4096, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32000})";
  auto c = ParseLlamaConfigJson(mistral, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window(), 4096);
  EXPECT_EQ(c->num_query_groups(), 8);
  EXPECT_FALSE(c->add_qkv_bias());
  const std::string text = LlamaConfigJson(*c, DType::kBFloat16);
  EXPECT_TRUE(absl::StrContains(text, "\"MistralForCausalLM\"")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\"model_type\": \"mistral\"")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\"sliding_window\": 4096")) << text;
  auto again = ParseLlamaConfigJson(text, "again.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->DebugString(), c->DebugString());
  // v0.2 and later: no window; the same tensors as Llama's.
  std::string open = mistral;
  open.replace(open.find("\"sliding_window\": 4096"), 22,
               "\"sliding_window\": null");
  auto unwindowed = ParseLlamaConfigJson(open, "open.json");
  ASSERT_TRUE(unwindowed.ok()) << unwindowed.status();
  EXPECT_EQ(unwindowed->sliding_window(), 0);
  EXPECT_EQ(HfArchitecture(*unwindowed), "LlamaForCausalLM");
  std::string bad = mistral;
  bad.replace(bad.find("\"sliding_window\": 4096"), 22,
              "\"sliding_window\": -4");
  EXPECT_NE(ParseLlamaConfigJson(bad, "bad.json")
                .status()
                .message()
                .find("\"sliding_window\""),
            std::string::npos);
}

checkpoint::ModelConfig Qwen3Config(bool tied) {
  checkpoint::ModelConfig c = SmallConfig(tied);
  c.set_qk_layernorm(true);
  return c;
}

TEST(HfLlamaTest, Qwen3QkNormMapsAndRoundTrips) {
  const auto config = Qwen3Config(/*tied=*/false);
  EXPECT_TRUE(CheckLlamaCompatible(config).ok());
  EXPECT_EQ(HfArchitecture(config), "Qwen3ForCausalLM");
  const auto params = RandomParams(config);
  auto hf = ExportLlama(params, config);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->size(), 2u + 2 * 11 + 1);
  EXPECT_EQ(Get(*hf, "model.layers.1.self_attn.q_norm.weight").ToDoubles(),
            params.at("decoder.layers.1.self_attention.q_layernorm.weight")
                .ToDoubles());
  EXPECT_EQ(Get(*hf, "model.layers.0.self_attn.k_norm.weight").ToDoubles(),
            params.at("decoder.layers.0.self_attention.k_layernorm.weight")
                .ToDoubles());
  auto back = ImportLlama(*hf, config);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), params.size());
  for (const auto& [name, t] : params) {
    ASSERT_TRUE(back->count(name)) << name;
    EXPECT_EQ(back->at(name).ToDoubles(), t.ToDoubles()) << name;
  }
  // A QKV bias with QK-norm has no Hugging Face class.
  checkpoint::ModelConfig both = config;
  both.set_add_qkv_bias(true);
  EXPECT_NE(CheckLlamaCompatible(both).message().find("QK-norm"),
            std::string::npos);
}

TEST(HfLlamaTest, ParsesAQwen3ConfigAndWritesQwen3Back) {
  const std::string qwen = R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "hidden_size": 4096, "intermediate_size": 12288,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "num_hidden_layers": 36, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
    "vocab_size": 151936, "max_position_embeddings": 40960,
    "attention_bias": false, "use_sliding_window": false,
    "tie_word_embeddings": false, "hidden_act": "silu",
    "rope_scaling": null, "torch_dtype": "bfloat16"})";
  auto c = ParseLlamaConfigJson(qwen, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_layernorm());
  EXPECT_FALSE(c->add_qkv_bias());
  EXPECT_FALSE(c->tied_embeddings());
  const std::string text = LlamaConfigJson(*c, DType::kBFloat16);
  EXPECT_TRUE(absl::StrContains(text, "\"Qwen3ForCausalLM\"")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\"head_dim\": 128")) << text;
  auto again = ParseLlamaConfigJson(text, "again.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->DebugString(), c->DebugString());
  // Qwen3-0.6B's head_dim 128 is not hidden / heads (64): refused by name.
  std::string small = qwen;
  small.replace(small.find("\"hidden_size\": 4096"), 19,
                "\"hidden_size\": 2048");
  EXPECT_NE(ParseLlamaConfigJson(small, "s.json")
                .status()
                .message()
                .find("\"head_dim\" 128"),
            std::string::npos);
  std::string biased = qwen;
  biased.replace(biased.find("\"attention_bias\": false"), 23,
                 "\"attention_bias\": true");
  EXPECT_NE(ParseLlamaConfigJson(biased, "b.json")
                .status()
                .message()
                .find("\"attention_bias\""),
            std::string::npos);
}

TEST(HfLlamaTest, ImportWidensBf16AndIgnoresExtraBuffers) {
  const auto config = SmallConfig(/*tied=*/false);
  auto hf = ExportLlama(RandomParams(config), config);
  ASSERT_TRUE(hf.ok());
  NamedTensors bf16;
  for (const auto& [name, t] : *hf) {
    bf16.emplace_back(name, *t.To(DType::kBFloat16));
  }
  bf16.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq",
                    Tensor::Zeros({2}, DType::kFloat32));
  auto back = ImportLlama(bf16, config);
  ASSERT_TRUE(back.ok()) << back.status();
  const Tensor& w = back->at("decoder.layers.0.mlp.linear_fc2.weight");
  EXPECT_EQ(w.dtype(), DType::kFloat32);
  EXPECT_EQ(w.ToDoubles(),
            Get(bf16, "model.layers.0.mlp.down_proj.weight").ToDoubles());
}

TEST(HfLlamaTest, ErrorsNameTheProblem) {
  auto config = SmallConfig(/*tied=*/false);
  auto hf = ExportLlama(RandomParams(config), config);
  ASSERT_TRUE(hf.ok());
  NamedTensors missing(hf->begin() + 1, hf->end());
  auto s = ImportLlama(missing, config).status();
  EXPECT_NE(s.message().find("model.embed_tokens.weight is missing"),
            std::string::npos)
      << s;
  NamedTensors wrong = *hf;
  for (auto& [name, t] : wrong) {
    if (name == "model.layers.1.self_attn.k_proj.weight") {
      t = Tensor::Zeros({12, 12}, DType::kFloat32);
    }
  }
  s = ImportLlama(wrong, config).status();
  EXPECT_NE(s.message().find("k_proj.weight is fp32[12, 12]"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("needs [6, 12]"), std::string::npos) << s;
  config.set_normalization(checkpoint::NORMALIZATION_LAYER_NORM);
  config.set_add_bias_linear(true);
  s = CheckLlamaCompatible(config);
  EXPECT_NE(s.message().find("RMSNorm"), std::string::npos) << s;
  EXPECT_NE(s.message().find("biases"), std::string::npos) << s;
}

TEST(HfLlamaTest, ConfigJsonRoundTrips) {
  const auto config = SmallConfig(/*tied=*/false);
  const std::string text = LlamaConfigJson(config, DType::kFloat32);
  EXPECT_TRUE(absl::StrContains(text, "\"model_type\": \"llama\"")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\"num_key_value_heads\": 2")) << text;
  EXPECT_TRUE(absl::StrContains(text, "\"tie_word_embeddings\": false"))
      << text;
  auto parsed = ParseLlamaConfigJson(text, "c.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  checkpoint::ModelConfig want = config;
  want.set_padded_vocab_size(11);
  EXPECT_EQ(parsed->DebugString(), want.DebugString());
}

TEST(HfLlamaTest, ParsesAHubConfigAndNamesBadKeys) {
  const std::string llama3 = R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 2048, "intermediate_size": 8192,
    "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 16, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "vocab_size": 128256, "max_position_embeddings": 8192,
    "tie_word_embeddings": true, "hidden_act": "silu", "rope_scaling": null,
    "torch_dtype": "bfloat16"})";
  auto c = ParseLlamaConfigJson(llama3, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_query_groups(), 8);
  EXPECT_EQ(c->ffn_hidden_size(), 8192);
  EXPECT_TRUE(c->tied_embeddings());
  EXPECT_EQ(c->rotary_base(), 500000.0);
  EXPECT_EQ(c->layernorm_epsilon(), 1e-5);
  auto error = [&](const std::string& from, const std::string& to) {
    std::string text = llama3;
    text.replace(text.find(from), from.size(), to);
    return std::string(
        ParseLlamaConfigJson(text, "x/config.json").status().message());
  };
  EXPECT_NE(error("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5")
                .find("x/config.json: \"num_attention_heads\" 32 is not a "
                      "multiple of \"num_key_value_heads\" 5"),
            std::string::npos);
  EXPECT_NE(
      error("\"rope_scaling\": null", "\"rope_scaling\": {\"factor\": 8.0}")
          .find("\"rope_scaling\""),
      std::string::npos);
  EXPECT_NE(error("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"")
                .find("\"hidden_act\" \"gelu\""),
            std::string::npos);
  EXPECT_NE(error("\"hidden_size\": 2048", "\"hidden_size\": -1")
                .find("\"hidden_size\" must be a positive 32-bit integer"),
            std::string::npos);
}

TEST(HfLlamaTest, ParsesLlama31RopeScalingAndWritesItBack) {
  const std::string llama31 = R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 32, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "vocab_size": 128256, "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192,
                     "rope_type": "llama3"}})";
  auto c = ParseLlamaConfigJson(llama31, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->has_rope_scaling());
  EXPECT_EQ(c->rope_scaling().rope_type(), "llama3");
  EXPECT_EQ(c->rope_scaling().factor(), 8.0);
  EXPECT_EQ(c->rope_scaling().low_freq_factor(), 1.0);
  EXPECT_EQ(c->rope_scaling().high_freq_factor(), 4.0);
  EXPECT_EQ(c->rope_scaling().original_max_position_embeddings(), 8192);
  const std::string text = LlamaConfigJson(*c, DType::kBFloat16);
  EXPECT_TRUE(absl::StrContains(text, "\"rope_type\": \"llama3\"")) << text;
  auto again = ParseLlamaConfigJson(text, "again.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->DebugString(), c->DebugString());
  // Without scaling the key stays null.
  EXPECT_TRUE(
      absl::StrContains(LlamaConfigJson(SmallConfig(false), DType::kFloat32),
                        "\"rope_scaling\": null"));
  // Older files name the type "type".
  std::string old = llama31;
  old.replace(old.find("\"rope_type\""), 11, "\"type\"");
  EXPECT_TRUE(ParseLlamaConfigJson(old, "old.json").ok());
  auto error = [&](const std::string& from, const std::string& to) {
    std::string t = llama31;
    t.replace(t.find(from), from.size(), to);
    return std::string(ParseLlamaConfigJson(t, "x.json").status().message());
  };
  EXPECT_NE(error("\"llama3\"", "\"yarn\"").find("type \"yarn\""),
            std::string::npos);
  EXPECT_NE(
      error("\"low_freq_factor\": 1.0,", "").find("lacks \"low_freq_factor\""),
      std::string::npos);
  EXPECT_NE(error("\"high_freq_factor\": 4.0", "\"high_freq_factor\": 0.5")
                .find("\"low_freq_factor\" < \"high_freq_factor\""),
            std::string::npos);
}

TEST(HfLlamaTest, WritesAndReadsShardedWeights) {
  const auto config = SmallConfig(/*tied=*/false);
  auto hf = ExportLlama(RandomParams(config), config);
  ASSERT_TRUE(hf.ok());
  const std::string dir = testing_util::FreshDir("hf_llama_shards");
  auto exists = [&](const std::string& f) {
    struct stat st;
    return stat((dir + "/" + f).c_str(), &st) == 0;
  };
  // 1200 bytes a shard: 7 shards (12 x 12 fp32 is 576 bytes).
  ASSERT_TRUE(WriteHfWeights(dir, *hf, 1200).ok());
  EXPECT_TRUE(exists("model.safetensors.index.json"));
  EXPECT_FALSE(exists("model.safetensors"));
  EXPECT_TRUE(exists("model-00001-of-00007.safetensors"));
  auto read = ReadHfWeights(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), hf->size());
  for (const auto& [name, t] : *hf) {
    EXPECT_EQ(Get(*read, name).ToDoubles(), t.ToDoubles()) << name;
  }
  // The index's total is the tensors' bytes.
  std::ifstream index(dir + "/model.safetensors.index.json");
  std::string text((std::istreambuf_iterator<char>(index)), {});
  int64_t total = 0;
  for (const auto& [name, t] : *hf) total += t.nbytes();
  EXPECT_TRUE(absl::StrContains(text, absl::StrCat("\"total_size\": ", total)))
      << text;
  // Written again unsharded: the shards and index go.
  ASSERT_TRUE(WriteHfWeights(dir, *hf, int64_t{1} << 40).ok());
  EXPECT_FALSE(exists("model.safetensors.index.json"));
  EXPECT_FALSE(exists("model-00001-of-00007.safetensors"));
  read = ReadHfWeights(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), hf->size());
  // An index naming a missing shard.
  {
    std::ofstream bad(dir + "/model.safetensors.index.json");
    bad << R"({"weight_map": {"a": "model-00001-of-00002.safetensors"}})";
  }
  auto s = ReadHfWeights(dir).status();
  EXPECT_NE(s.message().find("model-00001-of-00002.safetensors"),
            std::string::npos)
      << s;
}

TEST(HfLlamaTest, ParsesShardSizes) {
  EXPECT_EQ(*ParseByteSize("5GB"), 5000000000);
  EXPECT_EQ(*ParseByteSize("200mb"), 200000000);
  EXPECT_EQ(*ParseByteSize("64KB"), 64000);
  EXPECT_EQ(*ParseByteSize("123"), 123);
  EXPECT_FALSE(ParseByteSize("0").ok());
  EXPECT_FALSE(ParseByteSize("5 TB").ok());
  EXPECT_FALSE(ParseByteSize("GB").ok());
}

TEST(HfLlamaTest, ExportsATensorParallelCheckpoint) {
  // Saved by 2 tensor-parallel ranks as the model splits it (qkv by rows,
  // one K/V group a rank; fc1 [2, ffn, h] along dimension 1; proj and fc2
  // by columns; the vocabulary by rows), exported whole.
  for (const auto& config :
       {SmallConfig(false), Qwen2Config(false), Qwen3Config(false)}) {
    SCOPED_TRACE(HfArchitecture(config));
    const auto params = RandomParams(config);
    checkpoint::CommonState common;
    *common.mutable_model() = config;
    const std::string dir = testing_util::FreshDir(
        absl::StrCat("hf_llama_export_", HfArchitecture(config)));
    InProcessGroup group(2);
    std::vector<absl::Status> status(2);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, rank] {
        std::vector<ShardedTensorRef> refs;
        for (const auto& [name, t] : params) {
          int dim = -1;
          if (absl::StrContains(name, "linear_qkv") ||
              absl::StrContains(name, "word_embeddings") ||
              absl::StrContains(name, "output_layer")) {
            dim = 0;
          } else if (absl::StrContains(name, "linear_fc1") ||
                     absl::StrContains(name, "linear_proj") ||
                     absl::StrContains(name, "linear_fc2")) {
            dim = 1;
          }
          if (dim < 0) {
            refs.push_back(ShardedTensorRef::Replicated(name, t));
          } else {
            const int64_t len = t.size(dim) / 2;
            refs.push_back(ShardedTensorRef::SplitAlong(
                name, testing_util::SliceDim(t, dim, rank * len, len), dim,
                rank, 2));
          }
        }
        status[rank] =
            SaveCheckpoint(dir, 10, refs, common, {}, group.Context(rank));
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_TRUE(status[0].ok()) << status[0];
    ASSERT_TRUE(status[1].ok()) << status[1];
    auto reader = CheckpointReader::Open(dir);
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto got = ExportCheckpointToHfLlama(**reader);
    ASSERT_TRUE(got.ok()) << got.status();
    auto want = ExportLlama(params, config);
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(got->size(), want->size());
    for (const auto& [name, t] : *want) {
      EXPECT_EQ(Get(*got, name).ToDoubles(), t.ToDoubles()) << name;
    }
  }
}

// Mixtral: every layer MoE, 3 experts of hidden size 5, top-2.
checkpoint::ModelConfig MixtralConfig(bool tied) {
  checkpoint::ModelConfig c = SmallConfig(tied);
  c.set_num_experts(3);
  c.set_moe_router_topk(2);
  c.set_moe_ffn_hidden_size(5);
  c.set_ffn_hidden_size(5);
  c.set_moe_layer_pattern("[1,1]");
  c.set_moe_router_score_function("softmax");
  return c;
}

TEST(HfLlamaTest, MixtralExpertsSplitPerExpertAndRoundTrip) {
  const auto config = MixtralConfig(/*tied=*/false);
  const auto params = RandomParams(config);
  EXPECT_EQ(HfArchitecture(config), "MixtralForCausalLM");
  auto hf = ExportLlama(params, config);
  ASSERT_TRUE(hf.ok()) << hf.status();
  // Per layer: 2 norms, q, k, v, o, the gate and 3 x 3 expert tensors.
  EXPECT_EQ(hf->size(), 2u + 2 * (6 + 1 + 9) + 1);
  const std::string b = "model.layers.1.block_sparse_moe.";
  const Tensor& fc1 =
      params.at("decoder.layers.1.mlp.experts.linear_fc1.weight");
  const Tensor& fc2 =
      params.at("decoder.layers.1.mlp.experts.linear_fc2.weight");
  // Expert 2's rows of ours [3, 10, 12]: gate 20..24, up 25..29; w2 is
  // expert 2's [12, 5] of [3, 12, 5].
  EXPECT_EQ(Get(*hf, b + "experts.2.w1.weight").ToDoubles(),
            Rows(*fc1.Reshape({30, 12}), 20, 5));
  EXPECT_EQ(Get(*hf, b + "experts.2.w3.weight").ToDoubles(),
            Rows(*fc1.Reshape({30, 12}), 25, 5));
  EXPECT_EQ(Get(*hf, b + "experts.2.w2.weight").ToDoubles(),
            Rows(*fc2.Reshape({36, 5}), 24, 12));
  EXPECT_EQ(Get(*hf, b + "gate.weight").ToDoubles(),
            params.at("decoder.layers.1.mlp.router.weight").ToDoubles());
  auto back = ImportLlama(*hf, config);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), params.size());
  for (const auto& [name, t] : params) {
    ASSERT_TRUE(back->count(name)) << name;
    EXPECT_EQ(back->at(name).shape(), t.shape()) << name;
    EXPECT_EQ(back->at(name).ToDoubles(), t.ToDoubles()) << name;
  }
}

TEST(HfLlamaTest, MixtralAndQwen3MoeConfigsRoundTrip) {
  checkpoint::ModelConfig mixtral = MixtralConfig(/*tied=*/false);
  checkpoint::ModelConfig qwen3_moe = SmallConfig(/*tied=*/true);
  qwen3_moe.set_qk_layernorm(true);
  qwen3_moe.set_num_experts(4);
  qwen3_moe.set_moe_router_topk(1);
  qwen3_moe.set_moe_ffn_hidden_size(6);
  qwen3_moe.set_moe_layer_pattern("[0,1]");
  qwen3_moe.set_moe_router_score_function("softmax");
  for (const auto& [config, type] : {std::make_pair(mixtral, "mixtral"),
                                     std::make_pair(qwen3_moe, "qwen3_moe")}) {
    SCOPED_TRACE(type);
    const std::string text = LlamaConfigJson(config, DType::kFloat32);
    EXPECT_TRUE(
        absl::StrContains(text, absl::StrCat("\"model_type\": \"", type, "\"")))
        << text;
    auto parsed = ParseLlamaConfigJson(text, "c.json");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    checkpoint::ModelConfig want = config;
    want.set_padded_vocab_size(11);
    EXPECT_EQ(parsed->DebugString(), want.DebugString());
  }
  EXPECT_TRUE(absl::StrContains(LlamaConfigJson(qwen3_moe, DType::kFloat32),
                                "\"mlp_only_layers\": [\n    0\n  ]"));
  // Qwen3-MoE's tensor names; layer 0 stays a dense MLP.
  const auto params = RandomParams(qwen3_moe);
  auto hf = ExportLlama(params, qwen3_moe);
  ASSERT_TRUE(hf.ok()) << hf.status();
  Get(*hf, "model.layers.0.mlp.gate_proj.weight");
  Get(*hf, "model.layers.1.mlp.gate.weight");
  Get(*hf, "model.layers.1.mlp.experts.3.down_proj.weight");
  auto back = ImportLlama(*hf, qwen3_moe);
  ASSERT_TRUE(back.ok()) << back.status();
  for (const auto& [name, t] : params) {
    EXPECT_EQ(back->at(name).ToDoubles(), t.ToDoubles()) << name;
  }
}

// Qwen2-MoE: q/k/v biases, a dense first layer, a shared expert behind its
// sigmoid gate, top-k weights not renormalised.
checkpoint::ModelConfig Qwen2MoeConfig() {
  checkpoint::ModelConfig c = SmallConfig(/*tied=*/false);
  c.set_add_qkv_bias(true);
  c.set_num_experts(4);
  c.set_moe_router_topk(2);
  c.set_moe_ffn_hidden_size(6);
  c.set_moe_layer_pattern("[0,1]");
  c.set_moe_router_score_function("softmax");
  c.set_moe_shared_expert_intermediate_size(7);
  c.set_moe_shared_expert_gate(true);
  c.set_moe_router_pre_softmax(true);
  return c;
}

TEST(HfLlamaTest, Qwen2MoeSharedExpertAndGateRoundTrip) {
  const checkpoint::ModelConfig config = Qwen2MoeConfig();
  EXPECT_EQ(HfArchitecture(config), "Qwen2MoeForCausalLM");
  const std::string text = LlamaConfigJson(config, DType::kFloat32);
  for (const char* key :
       {"\"model_type\": \"qwen2_moe\"", "\"norm_topk_prob\": false",
        "\"shared_expert_intermediate_size\": 7",
        "\"moe_intermediate_size\": 6", "\"mlp_only_layers\": [\n    0\n  ]"}) {
    EXPECT_TRUE(absl::StrContains(text, key)) << key << "\n" << text;
  }
  EXPECT_FALSE(absl::StrContains(text, "attention_bias")) << text;
  auto parsed = ParseLlamaConfigJson(text, "c.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  checkpoint::ModelConfig want = config;
  want.set_padded_vocab_size(11);
  EXPECT_EQ(parsed->DebugString(), want.DebugString());

  const auto params = RandomParams(config);
  auto hf = ExportLlama(params, config);
  ASSERT_TRUE(hf.ok()) << hf.status();
  const std::string b = "model.layers.1.mlp.";
  const Tensor& shared1 =
      params.at("decoder.layers.1.mlp.shared_experts.linear_fc1.weight");
  // Ours [14, 12]: gate_proj rows 0..6, up_proj rows 7..13.
  EXPECT_EQ(Get(*hf, b + "shared_expert.gate_proj.weight").ToDoubles(),
            Rows(shared1, 0, 7));
  EXPECT_EQ(Get(*hf, b + "shared_expert.up_proj.weight").ToDoubles(),
            Rows(shared1, 7, 7));
  EXPECT_EQ(Get(*hf, b + "shared_expert.down_proj.weight").ToDoubles(),
            params.at("decoder.layers.1.mlp.shared_experts.linear_fc2.weight")
                .ToDoubles());
  EXPECT_EQ(Get(*hf, b + "shared_expert_gate.weight").shape(), (Shape{1, 12}));
  Get(*hf, "model.layers.0.mlp.gate_proj.weight");
  Get(*hf, "model.layers.1.self_attn.q_proj.bias");
  Get(*hf, b + "experts.3.down_proj.weight");
  auto back = ImportLlama(*hf, config);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), params.size());
  for (const auto& [name, t] : params) {
    EXPECT_EQ(back->at(name).ToDoubles(), t.ToDoubles()) << name;
  }
}

TEST(HfLlamaTest, MoeConfigsNotBuiltAreRefusedByName) {
  auto refused = [](checkpoint::ModelConfig c, const std::string& what) {
    const absl::Status s = CheckLlamaCompatible(c);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_TRUE(absl::StrContains(s.message(), what)) << s;
  };
  checkpoint::ModelConfig c = MixtralConfig(false);
  c.set_moe_shared_expert_intermediate_size(8);
  refused(c, "a shared expert or its gate without a QKV bias");
  c = Qwen2MoeConfig();
  c.set_moe_shared_expert_gate(false);
  refused(c, "without a gated shared expert");
  c = MixtralConfig(false);
  c.set_moe_router_pre_softmax(true);
  refused(c, "in a Mixtral, which always renormalises");
  c = MixtralConfig(false);
  c.set_moe_router_score_function("sigmoid");
  refused(c, "router scores 'sigmoid'");
  c = MixtralConfig(false);
  c.set_moe_router_enable_expert_bias(true);
  refused(c, "expert bias");
  c = MixtralConfig(false);
  c.set_moe_layer_pattern("[1,0]");
  refused(c, "Mixtral's layers are all MoE");
  c.set_moe_layer_pattern("[1]");
  refused(c, "does not list the 2 layers");
  // A Qwen2-MoE config.json without its shared expert's size, or with
  // q/k/v biases switched off.
  std::string qwen2_moe = LlamaConfigJson(Qwen2MoeConfig(), DType::kFloat32);
  std::string lacking = qwen2_moe;
  lacking.replace(lacking.find("\"shared_expert_intermediate_size\""),
                  std::string("\"shared_expert_intermediate_size\"").size(),
                  "\"unused\"");
  auto parsed = ParseLlamaConfigJson(lacking, "q/config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(absl::StrContains(parsed.status().message(),
                                "shared_expert_intermediate_size"))
      << parsed.status();
  EXPECT_TRUE(absl::StrContains(parsed.status().message(), "q/config.json"));
  qwen2_moe.replace(qwen2_moe.find("{"), 1, "{\"qkv_bias\": false, ");
  parsed = ParseLlamaConfigJson(qwen2_moe, "q/config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(absl::StrContains(parsed.status().message(), "qkv_bias"))
      << parsed.status();
  // Qwen3-MoE's norm_topk_prob false is now read as pre-softmax weights.
  checkpoint::ModelConfig q = MixtralConfig(false);
  q.set_qk_layernorm(true);
  q.set_moe_router_pre_softmax(true);
  const std::string qwen3_moe = LlamaConfigJson(q, DType::kFloat32);
  EXPECT_TRUE(absl::StrContains(qwen3_moe, "\"norm_topk_prob\": false"));
  parsed = ParseLlamaConfigJson(qwen3_moe, "c.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->moe_router_pre_softmax());
}

}  // namespace
}  // namespace mcc
