#include "checkpoint/hf_gpt2.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/hf_common.h"
#include "core/json_document.h"
#include "core/status_macros.h"

namespace mcc {
namespace {

using checkpoint::ModelConfig;

// out[j, i] = in[i, j] for a 2-d CPU tensor.
Tensor Transpose(const Tensor& in) {
  const int64_t rows = in.size(0), cols = in.size(1);
  Tensor out = Tensor::Empty({cols, rows}, in.dtype());
  const size_t es = DTypeSize(in.dtype());
  const char* src = static_cast<const char*>(in.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      std::memcpy(dst + (j * rows + i) * es, src + (i * cols + j) * es, es);
    }
  }
  return out;
}

// Reorders the leading dimension (3 * heads * head_dim rows of `row` elements
// each) between Megatron's [heads, 3, head_dim] and Hugging Face's
// [3, heads, head_dim]. to_hf picks the direction.
Tensor PermuteQkv(const Tensor& in, int64_t heads, bool to_hf) {
  const int64_t n = in.size(0);
  const int64_t head_dim = n / (3 * heads);
  const int64_t row = in.numel() / n;
  const size_t bytes = row * DTypeSize(in.dtype());
  Tensor out = Tensor::Empty(in.shape(), in.dtype());
  const char* src = static_cast<const char*>(in.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t w = 0; w < 3; ++w) {
      for (int64_t d = 0; d < head_dim; ++d) {
        const int64_t meg = (h * 3 + w) * head_dim + d;
        const int64_t hf = (w * heads + h) * head_dim + d;
        const int64_t from = to_hf ? meg : hf;
        const int64_t to = to_hf ? hf : meg;
        std::memcpy(dst + to * bytes, src + from * bytes, bytes);
      }
    }
  }
  return out;
}

enum class Kind { kCopy, kLinear, kQkvWeight, kQkvBias, kVocab };

struct Entry {
  std::string ours;
  std::string hf;
  Kind kind;
  Shape shape;  // Our shape.
};

std::vector<Entry> Table(const ModelConfig& c) {
  const int64_t h = c.hidden_size(), f = c.ffn_hidden_size();
  const int64_t v = StoredVocabRows(c), p = c.max_position_embeddings();
  std::vector<Entry> t = {
      {"embedding.word_embeddings.weight",
       "transformer.wte.weight",
       Kind::kVocab,
       {v, h}},
      {"embedding.position_embeddings.weight",
       "transformer.wpe.weight",
       Kind::kCopy,
       {p, h}},
  };
  for (int i = 0; i < c.num_layers(); ++i) {
    const std::string a = absl::StrCat("decoder.layers.", i, ".");
    const std::string b = absl::StrCat("transformer.h.", i, ".");
    for (const char* wb : {"weight", "bias"}) {
      const bool w = std::string(wb) == "weight";
      t.push_back(
          {a + "input_layernorm." + wb, b + "ln_1." + wb, Kind::kCopy, {h}});
      t.push_back({a + "self_attention.linear_qkv." + wb,
                   b + "attn.c_attn." + wb,
                   w ? Kind::kQkvWeight : Kind::kQkvBias,
                   w ? Shape{3 * h, h} : Shape{3 * h}});
      t.push_back({a + "self_attention.linear_proj." + wb,
                   b + "attn.c_proj." + wb, w ? Kind::kLinear : Kind::kCopy,
                   w ? Shape{h, h} : Shape{h}});
      t.push_back(
          {a + "pre_mlp_layernorm." + wb, b + "ln_2." + wb, Kind::kCopy, {h}});
      t.push_back({a + "mlp.linear_fc1." + wb, b + "mlp.c_fc." + wb,
                   w ? Kind::kLinear : Kind::kCopy,
                   w ? Shape{f, h} : Shape{f}});
      t.push_back({a + "mlp.linear_fc2." + wb, b + "mlp.c_proj." + wb,
                   w ? Kind::kLinear : Kind::kCopy,
                   w ? Shape{h, f} : Shape{h}});
    }
  }
  t.push_back({"decoder.final_layernorm.weight",
               "transformer.ln_f.weight",
               Kind::kCopy,
               {h}});
  t.push_back({"decoder.final_layernorm.bias",
               "transformer.ln_f.bias",
               Kind::kCopy,
               {h}});
  if (!c.tied_embeddings()) {
    t.push_back(
        {"output_layer.weight", "lm_head.weight", Kind::kVocab, {v, h}});
  }
  return t;
}

}  // namespace

absl::Status CheckGpt2Compatible(const ModelConfig& c) {
  std::vector<std::string> why;
  if (c.position_embedding_type() !=
      checkpoint::POSITION_EMBEDDING_LEARNED_ABSOLUTE) {
    why.push_back("position embeddings are not learned absolute");
  }
  if (c.normalization() != checkpoint::NORMALIZATION_LAYER_NORM) {
    why.push_back("normalization is not LayerNorm");
  }
  if (c.activation() != checkpoint::ACTIVATION_GELU) {
    why.push_back("activation is not GELU");
  }
  if (!c.add_bias_linear()) why.push_back("linear layers have no biases");
  if (c.num_query_groups() != 0 &&
      c.num_query_groups() != c.num_attention_heads()) {
    why.push_back(absl::StrCat("num_query_groups ", c.num_query_groups(),
                               " != num_attention_heads ",
                               c.num_attention_heads()));
  }
  if (c.num_attention_heads() <= 0 || c.hidden_size() <= 0 ||
      c.hidden_size() % c.num_attention_heads() != 0) {
    why.push_back(absl::StrCat("hidden_size ", c.hidden_size(),
                               " is not a multiple of num_attention_heads ",
                               c.num_attention_heads()));
  }
  if (why.empty()) return absl::OkStatus();
  std::string msg = "model cannot be expressed as GPT2LMHeadModel:";
  for (const auto& w : why) absl::StrAppend(&msg, " ", w, ";");
  return absl::FailedPreconditionError(msg);
}

absl::StatusOr<NamedTensors> ExportGpt2(
    const std::map<std::string, Tensor>& params, const ModelConfig& config) {
  MCC_RETURN_IF_ERROR(CheckGpt2Compatible(config));
  NamedTensors out;
  for (const Entry& e : Table(config)) {
    MCC_ASSIGN_OR_RETURN(Tensor t, FindTensorOfShape(params, e.ours, e.shape,
                                                     "GPT-2 export: parameter",
                                                     /*to_cpu=*/true));
    switch (e.kind) {
      case Kind::kCopy:
        break;
      case Kind::kLinear:
        t = Transpose(t);
        break;
      case Kind::kQkvWeight:
        t = Transpose(PermuteQkv(t, config.num_attention_heads(), true));
        break;
      case Kind::kQkvBias:
        t = PermuteQkv(t, config.num_attention_heads(), true);
        break;
      case Kind::kVocab:
        MCC_ASSIGN_OR_RETURN(t, t.Slice(0, HfVocabRows(config)));
        t = t.Clone();
        break;
    }
    out.emplace_back(e.hf, t);
  }
  return out;
}

absl::StatusOr<std::map<std::string, Tensor>> ImportGpt2(
    const NamedTensors& hf, const ModelConfig& config) {
  MCC_RETURN_IF_ERROR(CheckGpt2Compatible(config));
  // Each layer has 12 tensors: a configuration with more layers than the
  // file can hold fails here, before its tensor table is made.
  if (config.num_layers() < 0 ||
      config.num_layers() > static_cast<int64_t>(hf.size()) / 12) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPT-2 import: the configuration has ", config.num_layers(),
        " layers (12 tensors each) but the file holds ", hf.size(),
        " tensors"));
  }
  std::map<std::string, Tensor> by_name;
  for (const auto& [name, t] : hf) {
    const bool bare = !absl::StartsWith(name, "transformer.") &&
                      !absl::StartsWith(name, "lm_head.");
    by_name[bare ? "transformer." + name : name] = t;
  }
  std::map<std::string, Tensor> out;
  for (const Entry& e : Table(config)) {
    Shape hf_shape = e.shape;
    if (e.kind == Kind::kLinear || e.kind == Kind::kQkvWeight) {
      hf_shape = {e.shape[1], e.shape[0]};
    } else if (e.kind == Kind::kVocab) {
      hf_shape[0] = HfVocabRows(config);
    }
    MCC_ASSIGN_OR_RETURN(
        const Tensor t,
        FindTensorOfShape(by_name, e.hf, hf_shape, "GPT-2 import: tensor"));
    Tensor r;
    switch (e.kind) {
      case Kind::kCopy:
        r = t.Clone();
        break;
      case Kind::kLinear:
        r = Transpose(t);
        break;
      case Kind::kQkvWeight:
        r = PermuteQkv(Transpose(t), config.num_attention_heads(), false);
        break;
      case Kind::kQkvBias:
        r = PermuteQkv(t, config.num_attention_heads(), false);
        break;
      case Kind::kVocab: {
        r = Tensor::Zeros(e.shape, t.dtype());
        std::memcpy(r.raw_data(), t.raw_data(), t.nbytes());
        break;
      }
    }
    out[e.ours] = r;
  }
  return out;
}

absl::StatusOr<NamedTensors> ExportCheckpointToGpt2Tensors(
    CheckpointReader& reader) {
  const ModelConfig& config = reader.common_state().model();
  std::map<std::string, Tensor> params;
  for (const Entry& e : Table(config)) {
    MCC_ASSIGN_OR_RETURN(params[e.ours], reader.ReadTensor(e.ours));
  }
  return ExportGpt2(params, config);
}

absl::Status ExportCheckpointToHfGpt2(CheckpointReader& reader,
                                      const std::string& path) {
  MCC_ASSIGN_OR_RETURN(NamedTensors hf, ExportCheckpointToGpt2Tensors(reader));
  return WriteSafetensors(path, hf,
                          {{"format", "pt"},
                           {"source", reader.path()},
                           {"iteration", absl::StrCat(reader.iteration())}});
}

absl::StatusOr<ModelConfig> ParseGpt2ConfigJson(absl::string_view text,
                                                const std::string& path) {
  MCC_ASSIGN_OR_RETURN(const JsonDocument hf, ParseHfConfigJson(text, path));
  MCC_ASSIGN_OR_RETURN(int64_t vocab,
                       JsonPositiveInt(hf, "vocab_size", path, std::nullopt));
  MCC_ASSIGN_OR_RETURN(int64_t hidden,
                       JsonPositiveInt(hf, "n_embd", path, std::nullopt));
  MCC_ASSIGN_OR_RETURN(int64_t layers,
                       JsonPositiveInt(hf, "n_layer", path, std::nullopt));
  MCC_ASSIGN_OR_RETURN(int64_t heads,
                       JsonPositiveInt(hf, "n_head", path, std::nullopt));
  MCC_ASSIGN_OR_RETURN(int64_t positions,
                       JsonPositiveInt(hf, "n_positions", path, std::nullopt));
  MCC_ASSIGN_OR_RETURN(int64_t inner,
                       JsonPositiveInt(hf, "n_inner", path, 4 * hidden));
  MCC_ASSIGN_OR_RETURN(
      double eps, JsonPositiveNumber(hf, "layer_norm_epsilon", path, 1e-5));
  // Hugging Face's default: tied.
  MCC_ASSIGN_OR_RETURN(bool tied,
                       JsonBool(hf, "tie_word_embeddings", path, true));
  ModelConfig config;
  config.set_num_layers(layers);
  config.set_hidden_size(hidden);
  config.set_num_attention_heads(heads);
  config.set_num_query_groups(heads);
  config.set_ffn_hidden_size(inner);
  config.set_vocab_size(vocab);
  config.set_padded_vocab_size(vocab);  // The rows stored: no padding.
  config.set_seq_length(positions);
  config.set_max_position_embeddings(positions);
  config.set_tied_embeddings(tied);
  config.set_add_bias_linear(true);
  config.set_layernorm_epsilon(eps);
  config.set_rotary_base(10000.0);
  return config;
}

}  // namespace mcc
