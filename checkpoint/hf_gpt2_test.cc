#include "checkpoint/hf_gpt2.h"

#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/in_process_group.h"
#include "checkpoint/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using testing_util::RandomTensor;

checkpoint::ModelConfig SmallConfig(bool tied) {
  checkpoint::ModelConfig c;
  c.set_num_layers(2);
  c.set_hidden_size(12);
  c.set_num_attention_heads(3);
  c.set_num_query_groups(3);
  c.set_ffn_hidden_size(20);
  c.set_padded_vocab_size(16);
  c.set_vocab_size(11);
  c.set_max_position_embeddings(7);
  c.set_seq_length(7);
  c.set_add_bias_linear(true);
  c.set_tied_embeddings(tied);
  return c;
}

std::map<std::string, Tensor> RandomParams(const checkpoint::ModelConfig& c) {
  const int64_t h = c.hidden_size(), f = c.ffn_hidden_size(),
                v = c.padded_vocab_size();
  std::map<std::string, Tensor> p;
  uint32_t seed = 1;
  auto add = [&](const std::string& name, Shape shape) {
    p[name] = RandomTensor(shape, DType::kFloat32, seed++);
  };
  add("embedding.word_embeddings.weight", {v, h});
  add("embedding.position_embeddings.weight", {c.max_position_embeddings(), h});
  for (int i = 0; i < c.num_layers(); ++i) {
    const std::string l = absl::StrCat("decoder.layers.", i, ".");
    add(l + "input_layernorm.weight", {h});
    add(l + "input_layernorm.bias", {h});
    add(l + "self_attention.linear_qkv.weight", {3 * h, h});
    add(l + "self_attention.linear_qkv.bias", {3 * h});
    add(l + "self_attention.linear_proj.weight", {h, h});
    add(l + "self_attention.linear_proj.bias", {h});
    add(l + "pre_mlp_layernorm.weight", {h});
    add(l + "pre_mlp_layernorm.bias", {h});
    add(l + "mlp.linear_fc1.weight", {f, h});
    add(l + "mlp.linear_fc1.bias", {f});
    add(l + "mlp.linear_fc2.weight", {h, f});
    add(l + "mlp.linear_fc2.bias", {h});
  }
  add("decoder.final_layernorm.weight", {h});
  add("decoder.final_layernorm.bias", {h});
  if (!c.tied_embeddings()) add("output_layer.weight", {v, h});
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

// y = W x + b for a Linear weight [out, in] (ours).
std::vector<double> LinearOurs(const Tensor& w, const Tensor& b,
                               const std::vector<double>& x) {
  const auto wv = w.ToDoubles(), bv = b.ToDoubles();
  const int64_t out = w.size(0), in = w.size(1);
  std::vector<double> y(out);
  for (int64_t o = 0; o < out; ++o) {
    y[o] = bv[o];
    for (int64_t i = 0; i < in; ++i) y[o] += wv[o * in + i] * x[i];
  }
  return y;
}

// y = x C + b for a Conv1D weight [in, out] (Hugging Face's).
std::vector<double> Conv1D(const Tensor& c, const Tensor& b,
                           const std::vector<double>& x) {
  const auto cv = c.ToDoubles(), bv = b.ToDoubles();
  const int64_t in = c.size(0), out = c.size(1);
  std::vector<double> y(out);
  for (int64_t o = 0; o < out; ++o) {
    y[o] = bv[o];
    for (int64_t i = 0; i < in; ++i) y[o] += x[i] * cv[i * out + o];
  }
  return y;
}

TEST(HfGpt2Test, ExportComputesTheSameLayers) {
  const auto config = SmallConfig(/*tied=*/true);
  const auto params = RandomParams(config);
  auto hf = ExportGpt2(params, config);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->size(), 4u + 12u * config.num_layers());
  std::set<std::string> names;
  for (const auto& [n, t] : *hf) names.insert(n);
  EXPECT_TRUE(names.count("transformer.h.1.attn.c_attn.weight"));
  EXPECT_TRUE(names.count("transformer.ln_f.bias"));
  EXPECT_FALSE(names.count("lm_head.weight"));  // Tied.

  const int64_t h = 12, heads = 3, hd = 4;
  const std::vector<double> x =
      RandomTensor({h}, DType::kFloat32, 99).ToDoubles();
  for (int layer = 0; layer < 2; ++layer) {
    const std::string l = absl::StrCat("decoder.layers.", layer, ".");
    const std::string g = absl::StrCat("transformer.h.", layer, ".");
    // Attention input projection: q, k, v of every head agree.
    const auto ours =
        LinearOurs(params.at(l + "self_attention.linear_qkv.weight"),
                   params.at(l + "self_attention.linear_qkv.bias"), x);
    const auto theirs = Conv1D(Get(*hf, g + "attn.c_attn.weight"),
                               Get(*hf, g + "attn.c_attn.bias"), x);
    EXPECT_EQ(Get(*hf, g + "attn.c_attn.weight").shape(), (Shape{h, 3 * h}));
    for (int64_t head = 0; head < heads; ++head) {
      for (int64_t which = 0; which < 3; ++which) {  // q, k, v
        for (int64_t d = 0; d < hd; ++d) {
          EXPECT_DOUBLE_EQ(ours[(head * 3 + which) * hd + d],
                           theirs[which * h + head * hd + d])
              << "layer " << layer << " head " << head << " qkv " << which;
        }
      }
    }
    // The other Linear layers.
    for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
             {"self_attention.linear_proj", "attn.c_proj"},
             {"mlp.linear_fc1", "mlp.c_fc"}}) {
      EXPECT_EQ(
          LinearOurs(params.at(l + a + ".weight"), params.at(l + a + ".bias"),
                     x),
          Conv1D(Get(*hf, g + b + ".weight"), Get(*hf, g + b + ".bias"), x))
          << a;
    }
    const std::vector<double> xf =
        RandomTensor({20}, DType::kFloat32, 98).ToDoubles();
    EXPECT_EQ(LinearOurs(params.at(l + "mlp.linear_fc2.weight"),
                         params.at(l + "mlp.linear_fc2.bias"), xf),
              Conv1D(Get(*hf, g + "mlp.c_proj.weight"),
                     Get(*hf, g + "mlp.c_proj.bias"), xf));
    EXPECT_EQ(Get(*hf, g + "ln_2.bias").ToDoubles(),
              params.at(l + "pre_mlp_layernorm.bias").ToDoubles());
  }
  // The vocabulary loses its padding rows.
  const Tensor& wte = Get(*hf, "transformer.wte.weight");
  EXPECT_EQ(wte.shape(), (Shape{11, h}));
  const auto full = params.at("embedding.word_embeddings.weight").ToDoubles();
  EXPECT_EQ(wte.ToDoubles(),
            std::vector<double>(full.begin(), full.begin() + 11 * h));
}

TEST(HfGpt2Test, ImportInvertsExportAndAcceptsBareNames) {
  const auto config = SmallConfig(/*tied=*/false);
  const auto params = RandomParams(config);
  auto hf = ExportGpt2(params, config);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(Get(*hf, "lm_head.weight").shape(), (Shape{11, 12}));
  // Strip "transformer." as the Hub's files do.
  NamedTensors bare;
  for (const auto& [n, t] : *hf) {
    bare.emplace_back(absl::StartsWith(n, "transformer.") ? n.substr(12) : n,
                      t);
  }
  for (const NamedTensors* input : {&*hf, &bare}) {
    auto back = ImportGpt2(*input, config);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->size(), params.size());
    for (const auto& [name, t] : params) {
      const Tensor& got = back->at(name);
      ASSERT_EQ(got.shape(), t.shape()) << name;
      auto want = t.ToDoubles();
      if (name == "embedding.word_embeddings.weight" ||
          name == "output_layer.weight") {
        std::fill(want.begin() + 11 * 12, want.end(), 0.0);  // Padding.
      }
      EXPECT_EQ(got.ToDoubles(), want) << name;
    }
  }
}

TEST(HfGpt2Test, ErrorsNameTheProblem) {
  auto config = SmallConfig(true);
  auto params = RandomParams(config);
  params.erase("decoder.layers.1.mlp.linear_fc1.bias");
  auto hf = ExportGpt2(params, config);
  EXPECT_TRUE(absl::IsNotFound(hf.status()));
  EXPECT_NE(hf.status().message().find("decoder.layers.1.mlp.linear_fc1.bias"),
            std::string::npos);
  params = RandomParams(config);
  params["decoder.layers.0.mlp.linear_fc2.weight"] =
      RandomTensor({12, 24}, DType::kFloat32, 3);
  hf = ExportGpt2(params, config);
  EXPECT_NE(hf.status().message().find("[12, 20]"), std::string::npos)
      << hf.status();
  config.set_normalization(checkpoint::NORMALIZATION_RMS_NORM);
  config.set_num_query_groups(1);
  absl::Status s = CheckGpt2Compatible(config);
  EXPECT_NE(s.message().find("LayerNorm"), std::string::npos) << s;
  EXPECT_NE(s.message().find("num_query_groups 1"), std::string::npos) << s;
}

TEST(HfGpt2Test, ExportsATensorParallelCheckpoint) {
  // Saved by 2 tensor-parallel ranks (Megatron's splits: qkv and fc1 by rows,
  // proj and fc2 by columns, the rest replicated), exported whole.
  auto config = SmallConfig(/*tied=*/true);
  const auto params = RandomParams(config);
  checkpoint::CommonState common;
  *common.mutable_model() = config;
  const std::string dir = testing_util::FreshDir("hf_export");
  InProcessGroup group(2);
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<ShardedTensorRef> refs;
      for (const auto& [name, t] : params) {
        int dim = -1;
        if (absl::StrContains(name, "linear_qkv") ||
            absl::StrContains(name, "linear_fc1") ||
            name == "embedding.word_embeddings.weight") {
          dim = 0;
        } else if (absl::StrContains(name, ".weight") &&
                   (absl::StrContains(name, "linear_proj") ||
                    absl::StrContains(name, "linear_fc2"))) {
          dim = 1;
        }
        if (dim < 0) {
          refs.push_back(ShardedTensorRef::Replicated(name, t));
        } else {
          const int64_t len = t.size(dim) / 2;
          refs.push_back(ShardedTensorRef::SplitAlong(
              name, testing_util::SliceDim(t, dim, rank * len, len), dim, rank,
              2));
        }
      }
      status[rank] =
          SaveCheckpoint(dir, 10, refs, common, {}, group.Context(rank));
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const std::string out = dir + "/model.safetensors";
  ASSERT_TRUE(ExportCheckpointToHfGpt2(**reader, out).ok());
  auto file = ReadSafetensors(out);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("iteration"), "10");
  auto want = ExportGpt2(params, config);
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(file->tensors.size(), want->size());
  for (const auto& [name, t] : *want) {
    const Tensor* got = file->Find(name);
    ASSERT_NE(got, nullptr) << name;
    EXPECT_EQ(got->ToDoubles(), t.ToDoubles()) << name;
  }
}

TEST(HfGpt2, ParsesConfigJson) {
  auto c = ParseGpt2ConfigJson(
      R"({"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
          "n_positions": 1024, "layer_norm_epsilon": 1e-05,
          "tie_word_embeddings": false, "n_inner": null})",
      "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_layers(), 12);
  EXPECT_EQ(c->ffn_hidden_size(), 4 * 768);
  EXPECT_EQ(c->vocab_size(), 50257);
  EXPECT_DOUBLE_EQ(c->layernorm_epsilon(), 1e-5);
  EXPECT_FALSE(c->tied_embeddings());
  EXPECT_TRUE(CheckGpt2Compatible(*c).ok());
}

// Seen while writing //checkpoint/fuzz:hf_gpt2_import_fuzz_test: a
// non-numeric epsilon threw from std::stod (an abort), and sizes were not
// checked at all.
TEST(HfGpt2, ConfigJsonErrorsNameFileAndKey) {
  const std::string base =
      R"("vocab_size": 8, "n_embd": 4, "n_head": 2, "n_positions": 4)";
  auto expect = [](const std::string& text, const std::string& what) {
    auto c = ParseGpt2ConfigJson(text, "hf/config.json");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find("hf/config.json"), std::string::npos)
        << c.status();
    EXPECT_NE(c.status().message().find(what), std::string::npos) << c.status();
  };
  expect("{" + base + R"(, "n_layer": -1})", "\"n_layer\" must be a positive");
  expect("{" + base + R"(, "n_layer": 99999999999})", "n_layer");
  expect("{" + base + "}", "missing \"n_layer\"");
  expect("{" + base + R"(, "n_layer": 1, "layer_norm_epsilon": "x"})",
         "layer_norm_epsilon");
  expect("{" + base + R"(, "n_layer": 1, "tie_word_embeddings": 1})",
         "tie_word_embeddings");
  expect("[1, 2]", "not a JSON object");
  expect("{", "hf/config.json");
}

TEST(HfGpt2, ImportRefusesMoreLayersThanTheFileHolds) {
  checkpoint::ModelConfig c;
  c.set_num_layers(1 << 30);
  c.set_hidden_size(4);
  c.set_num_attention_heads(2);
  c.set_vocab_size(8);
  c.set_add_bias_linear(true);
  auto r = ImportGpt2({}, c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1073741824 layers"), std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace mcc
