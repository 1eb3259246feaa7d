#include "checkpoint/hf_llama.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_common.h"
#include "core/json_document.h"
#include "core/status_macros.h"

namespace mcc {
namespace {

using checkpoint::ModelConfig;

// How one of our tensors becomes Hugging Face tensors.
enum class Kind {
  kCopy,     // one tensor, same shape
  kVocab,    // one tensor, the true vocabulary's rows
  kQkv,      // linear_qkv -> q_proj, k_proj, v_proj
  kQkvBias,  // linear_qkv.bias -> q_proj.bias, k_proj.bias, v_proj.bias
  kFc1,      // linear_fc1 [2, ffn, h] -> gate_proj, up_proj
  // MoE experts: linear_fc1 [E, 2f, h] -> per expert its gate and up
  // projections [f, h] (names: gate_0, up_0, gate_1, ...); linear_fc2
  // [E, h, f] -> per expert its down projection [h, f].
  kExpertsFc1,
  kExpertsFc2,
  // Qwen2-MoE's shared expert: linear_fc1 [2 fs, h] -> gate_proj, up_proj
  // [fs, h] (rows, as the experts' parts).
  kSharedFc1,
};

struct Entry {
  std::string ours;
  std::vector<std::string> hf;  // One name, or the parts (kQkv, kFc1).
  Kind kind;
  Shape shape;  // Ours.
};

struct Dims {
  int64_t h, f, v, heads, groups, d;
  int64_t experts = 0, fm = 0;  // MoE: experts and each one's hidden size.
  int64_t fs = 0;               // The shared expert's hidden size.
  int64_t per_group() const { return heads / groups; }
};

// Which layers are MoE, from the stored pattern "[1,0,...]" (all dense
// without experts); nullopt when the pattern does not list num_layers 0s
// and 1s.
std::optional<std::vector<bool>> MoeLayers(const ModelConfig& c) {
  std::vector<bool> out;
  if (c.num_experts() <= 0) {
    out.assign(std::max(0, c.num_layers()), false);
    return out;
  }
  const std::string& p = c.moe_layer_pattern();
  if (p.size() < 2 || p.front() != '[' || p.back() != ']') return std::nullopt;
  for (size_t i = 1; i + 1 < p.size(); ++i) {
    if (p[i] == ',' || p[i] == ' ') continue;
    if (p[i] != '0' && p[i] != '1') return std::nullopt;
    out.push_back(p[i] == '1');
  }
  if (static_cast<int64_t>(out.size()) != c.num_layers()) return std::nullopt;
  return out;
}

std::string MoePattern(const std::vector<bool>& layers) {
  std::string p = "[";
  for (size_t i = 0; i < layers.size(); ++i) {
    if (i > 0) p += ",";
    p += layers[i] ? "1" : "0";
  }
  return p + "]";
}

Dims DimsOf(const ModelConfig& c) {
  Dims m;
  m.h = c.hidden_size();
  m.f = c.ffn_hidden_size();
  m.v = StoredVocabRows(c);
  m.heads = c.num_attention_heads();
  m.groups = c.num_query_groups() > 0 ? c.num_query_groups() : m.heads;
  m.d = m.heads > 0 ? m.h / m.heads : 0;
  m.experts = c.num_experts();
  m.fm = c.moe_ffn_hidden_size();
  m.fs = c.moe_shared_expert_intermediate_size();
  return m;
}

std::vector<Entry> Table(const ModelConfig& c) {
  const Dims m = DimsOf(c);
  const std::optional<std::vector<bool>> moe = MoeLayers(c);
  std::vector<Entry> t = {{"embedding.word_embeddings.weight",
                           {"model.embed_tokens.weight"},
                           Kind::kVocab,
                           {m.v, m.h}}};
  for (int i = 0; i < c.num_layers(); ++i) {
    const std::string a = absl::StrCat("decoder.layers.", i, ".");
    const std::string b = absl::StrCat("model.layers.", i, ".");
    t.push_back({a + "input_layernorm.weight",
                 {b + "input_layernorm.weight"},
                 Kind::kCopy,
                 {m.h}});
    t.push_back({a + "self_attention.linear_qkv.weight",
                 {b + "self_attn.q_proj.weight", b + "self_attn.k_proj.weight",
                  b + "self_attn.v_proj.weight"},
                 Kind::kQkv,
                 {m.groups * (m.per_group() + 2) * m.d, m.h}});
    if (c.add_qkv_bias()) {
      t.push_back({a + "self_attention.linear_qkv.bias",
                   {b + "self_attn.q_proj.bias", b + "self_attn.k_proj.bias",
                    b + "self_attn.v_proj.bias"},
                   Kind::kQkvBias,
                   {m.groups * (m.per_group() + 2) * m.d}});
    }
    if (c.qk_layernorm()) {
      t.push_back({a + "self_attention.q_layernorm.weight",
                   {b + "self_attn.q_norm.weight"},
                   Kind::kCopy,
                   {m.d}});
      t.push_back({a + "self_attention.k_layernorm.weight",
                   {b + "self_attn.k_norm.weight"},
                   Kind::kCopy,
                   {m.d}});
    }
    t.push_back({a + "self_attention.linear_proj.weight",
                 {b + "self_attn.o_proj.weight"},
                 Kind::kCopy,
                 {m.h, m.heads * m.d}});
    t.push_back({a + "pre_mlp_layernorm.weight",
                 {b + "post_attention_layernorm.weight"},
                 Kind::kCopy,
                 {m.h}});
    if (moe.has_value() && (*moe)[i]) {
      // Mixtral's block_sparse_moe (w1 gate, w3 up, w2 down), Qwen3-MoE's
      // and Qwen2-MoE's mlp (gate_proj, up_proj, down_proj).
      const bool mixtral = !c.qk_layernorm() && !c.add_qkv_bias();
      const std::string block = b + (mixtral ? "block_sparse_moe." : "mlp.");
      t.push_back({a + "mlp.router.weight",
                   {block + "gate.weight"},
                   Kind::kCopy,
                   {m.experts, m.h}});
      std::vector<std::string> fc1, fc2;
      for (int64_t e = 0; e < m.experts; ++e) {
        const std::string x = absl::StrCat(block, "experts.", e, ".");
        fc1.push_back(x + (mixtral ? "w1.weight" : "gate_proj.weight"));
        fc1.push_back(x + (mixtral ? "w3.weight" : "up_proj.weight"));
        fc2.push_back(x + (mixtral ? "w2.weight" : "down_proj.weight"));
      }
      t.push_back({a + "mlp.experts.linear_fc1.weight",
                   fc1,
                   Kind::kExpertsFc1,
                   {m.experts, 2 * m.fm, m.h}});
      t.push_back({a + "mlp.experts.linear_fc2.weight",
                   fc2,
                   Kind::kExpertsFc2,
                   {m.experts, m.h, m.fm}});
      if (m.fs > 0) {
        // Qwen2-MoE's shared_expert and its sigmoid shared_expert_gate.
        t.push_back({a + "mlp.shared_experts.linear_fc1.weight",
                     {block + "shared_expert.gate_proj.weight",
                      block + "shared_expert.up_proj.weight"},
                     Kind::kSharedFc1,
                     {2 * m.fs, m.h}});
        t.push_back({a + "mlp.shared_experts.linear_fc2.weight",
                     {block + "shared_expert.down_proj.weight"},
                     Kind::kCopy,
                     {m.h, m.fs}});
        t.push_back({a + "mlp.shared_experts.gate_weight",
                     {block + "shared_expert_gate.weight"},
                     Kind::kCopy,
                     {1, m.h}});
      }
      continue;
    }
    t.push_back({a + "mlp.linear_fc1.weight",
                 {b + "mlp.gate_proj.weight", b + "mlp.up_proj.weight"},
                 Kind::kFc1,
                 {2, m.f, m.h}});
    t.push_back({a + "mlp.linear_fc2.weight",
                 {b + "mlp.down_proj.weight"},
                 Kind::kCopy,
                 {m.h, m.f}});
  }
  t.push_back({"decoder.final_layernorm.weight",
               {"model.norm.weight"},
               Kind::kCopy,
               {m.h}});
  if (!c.tied_embeddings()) {
    t.push_back(
        {"output_layer.weight", {"lm_head.weight"}, Kind::kVocab, {m.v, m.h}});
  }
  return t;
}

// Copies `rows` rows of `row_bytes` from src row `from` to dst row `to`.
void CopyRows(const Tensor& src, int64_t from, Tensor* dst, int64_t to,
              int64_t rows, size_t row_bytes) {
  std::memcpy(static_cast<char*>(dst->raw_data()) + to * row_bytes,
              static_cast<const char*>(src.raw_data()) + from * row_bytes,
              rows * row_bytes);
}

// Our fused QKV rows [groups, per_group + 2, d] to q [heads, d], k and v
// [groups, d] (to_hf), or back; a row is the weight's h elements or the
// bias's one.
void MapQkv(const Dims& m, bool to_hf, Tensor* fused, Tensor* q, Tensor* k,
            Tensor* v) {
  const int64_t row_elements = fused->dim() == 1 ? 1 : m.h;
  const size_t row = row_elements * DTypeSize(fused->dtype());
  const int64_t block = (m.per_group() + 2) * m.d;
  for (int64_t g = 0; g < m.groups; ++g) {
    const int64_t base = g * block;
    const int64_t qn = m.per_group() * m.d;
    if (to_hf) {
      CopyRows(*fused, base, q, g * qn, qn, row);
      CopyRows(*fused, base + qn, k, g * m.d, m.d, row);
      CopyRows(*fused, base + qn + m.d, v, g * m.d, m.d, row);
    } else {
      CopyRows(*q, g * qn, fused, base, qn, row);
      CopyRows(*k, g * m.d, fused, base + qn, m.d, row);
      CopyRows(*v, g * m.d, fused, base + qn + m.d, m.d, row);
    }
  }
}

// The Hugging Face shapes of an entry's tensors.
std::vector<Shape> HfShapes(const Entry& e, const Dims& m,
                            const ModelConfig& c) {
  switch (e.kind) {
    case Kind::kCopy:
      return {e.shape};
    case Kind::kVocab:
      return {{HfVocabRows(c), m.h}};
    case Kind::kQkv:
      return {
          {m.heads * m.d, m.h}, {m.groups * m.d, m.h}, {m.groups * m.d, m.h}};
    case Kind::kQkvBias:
      return {{m.heads * m.d}, {m.groups * m.d}, {m.groups * m.d}};
    case Kind::kFc1:
      return {{m.f, m.h}, {m.f, m.h}};
    case Kind::kExpertsFc1:
      return std::vector<Shape>(2 * m.experts, Shape{m.fm, m.h});
    case Kind::kExpertsFc2:
      return std::vector<Shape>(m.experts, Shape{m.h, m.fm});
    case Kind::kSharedFc1:
      return {{m.fs, m.h}, {m.fs, m.h}};
  }
  return {};
}

// config.json's rope_scaling: null or absent is none; a "llama3" object
// (its type under "rope_type", or "type" as older files have it) needs all
// four of its parameters. Other types are refused, naming the type.
absl::StatusOr<std::optional<checkpoint::RopeScaling>> ParseRopeScaling(
    const JsonDocument& hf, const std::string& path) {
  if (!hf.contains("rope_scaling") || hf["rope_scaling"].is_null()) {
    return std::nullopt;
  }
  const JsonDocument& r = hf["rope_scaling"];
  if (!r.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": \"rope_scaling\" ", r.dump(), " is not an object or null"));
  }
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (r.contains(key) && r[key].is_string()) {
      type = r[key].get<std::string>();
      break;
    }
  }
  if (type == "default") return std::nullopt;
  if (type != "llama3") {
    return absl::UnimplementedError(
        absl::StrCat(path, ": \"rope_scaling\" type \"", type,
                     "\" is not supported; only \"llama3\" (Llama 3.x) is"));
  }
  const std::string where = absl::StrCat(path, ": rope_scaling");
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor",
                          "original_max_position_embeddings"}) {
    if (!r.contains(key) || r[key].is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " of type llama3 lacks \"", key, "\""));
    }
  }
  checkpoint::RopeScaling out;
  out.set_rope_type(type);
  MCC_ASSIGN_OR_RETURN(double factor,
                       JsonPositiveNumber(r, "factor", where, 0.0));
  MCC_ASSIGN_OR_RETURN(double low,
                       JsonPositiveNumber(r, "low_freq_factor", where, 0.0));
  MCC_ASSIGN_OR_RETURN(double high,
                       JsonPositiveNumber(r, "high_freq_factor", where, 0.0));
  MCC_ASSIGN_OR_RETURN(int64_t original,
                       JsonPositiveInt(r, "original_max_position_embeddings",
                                       where, std::nullopt));
  if (factor < 1.0 || high <= low) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": need \"factor\" >= 1 and \"low_freq_factor\" < "
                     "\"high_freq_factor\", got ",
                     factor, ", ", low, " and ", high));
  }
  out.set_factor(factor);
  out.set_low_freq_factor(low);
  out.set_high_freq_factor(high);
  out.set_original_max_position_embeddings(original);
  return out;
}

// rope_scaling as Hugging Face writes it (keys sorted), or null.
nlohmann::ordered_json RopeScalingJson(const ModelConfig& c) {
  if (!c.has_rope_scaling()) return nullptr;
  const checkpoint::RopeScaling& r = c.rope_scaling();
  return {{"factor", r.factor()},
          {"high_freq_factor", r.high_freq_factor()},
          {"low_freq_factor", r.low_freq_factor()},
          {"original_max_position_embeddings",
           r.original_max_position_embeddings()},
          {"rope_type", r.rope_type()}};
}

}  // namespace

absl::Status CheckLlamaCompatible(const ModelConfig& c) {
  std::vector<std::string> why;
  if (c.position_embedding_type() != checkpoint::POSITION_EMBEDDING_ROPE) {
    why.push_back("position embeddings are not rotary (RoPE)");
  }
  if (c.normalization() != checkpoint::NORMALIZATION_RMS_NORM) {
    why.push_back("normalization is not RMSNorm");
  }
  if (c.activation() != checkpoint::ACTIVATION_SWIGLU) {
    why.push_back("activation is not SwiGLU");
  }
  if (c.add_bias_linear()) why.push_back("linear layers have biases");
  if (c.add_qkv_bias() && c.qk_layernorm()) {
    why.push_back(
        "a QKV bias with QK-norm (Qwen3's attention_bias also biases o_proj)");
  }
  if (c.sliding_window() > 0 && (c.add_qkv_bias() || c.qk_layernorm())) {
    why.push_back(
        "a sliding window with a QKV bias or QK-norm (Qwen's "
        "use_sliding_window is not supported)");
  }
  if (c.sliding_window() > 0 && c.has_rope_scaling()) {
    why.push_back(
        "a sliding window with rope_scaling (MistralForCausalLM "
        "has no rope_scaling)");
  }
  if (c.has_rope_scaling() && c.rope_scaling().rope_type() != "llama3") {
    why.push_back(absl::StrCat("rope_scaling type '",
                               c.rope_scaling().rope_type(),
                               "' is not llama3"));
  }
  const Dims m = DimsOf(c);
  if (m.heads <= 0 || m.h <= 0 || m.h % m.heads != 0) {
    why.push_back(absl::StrCat("hidden_size ", m.h,
                               " is not a multiple of num_attention_heads ",
                               m.heads));
  } else if (m.groups <= 0 || m.heads % m.groups != 0) {
    why.push_back(absl::StrCat("num_attention_heads ", m.heads,
                               " is not a multiple of num_query_groups ",
                               m.groups));
  }
  if (c.num_experts() > 0) {
    const std::optional<std::vector<bool>> moe = MoeLayers(c);
    if (!moe.has_value()) {
      why.push_back(absl::StrCat("moe_layer_pattern '", c.moe_layer_pattern(),
                                 "' does not list the ", c.num_layers(),
                                 " layers"));
    } else if (!c.qk_layernorm() && !c.add_qkv_bias() &&
               std::find(moe->begin(), moe->end(), false) != moe->end()) {
      why.push_back(
          "a dense layer among MoE layers without QK-norm or a QKV bias "
          "(Mixtral's layers are all MoE; Qwen3-MoE's and Qwen2-MoE's "
          "mlp_only_layers need theirs)");
    }
    // Qwen2-MoE (a QKV bias): a shared expert with its sigmoid gate; the
    // others have no shared expert.
    const bool shared = c.moe_shared_expert_intermediate_size() > 0;
    if (c.add_qkv_bias() && !(shared && c.moe_shared_expert_gate())) {
      why.push_back(
          "experts with a QKV bias but without a gated shared expert "
          "(Qwen2-MoE's shared_expert and shared_expert_gate)");
    }
    if (!c.add_qkv_bias() && (shared || c.moe_shared_expert_gate())) {
      why.push_back(
          "a shared expert or its gate without a QKV bias (only Qwen2-MoE "
          "has one; Mixtral and Qwen3-MoE do not)");
    }
    if (c.moe_router_pre_softmax() && !c.qk_layernorm() && !c.add_qkv_bias()) {
      why.push_back(
          "unnormalised top-k weights (--moe-router-pre-softmax) in a "
          "Mixtral, which always renormalises");
    }
    if (c.moe_router_score_function() != "softmax") {
      why.push_back(absl::StrCat("router scores '",
                                 c.moe_router_score_function(),
                                 "' are not softmax"));
    }
    if (c.moe_router_enable_expert_bias()) {
      why.push_back(
          "the router's expert bias has no Mixtral or Qwen-MoE tensor");
    }
    if (c.sliding_window() > 0) {
      why.push_back("a sliding window with experts");
    }
  }
  if (why.empty()) return absl::OkStatus();
  std::string msg =
      "model cannot be expressed as LlamaForCausalLM, MistralForCausalLM, "
      "Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, "
      "Qwen2MoeForCausalLM or Qwen3MoeForCausalLM:";
  for (const auto& w : why) absl::StrAppend(&msg, " ", w, ";");
  return absl::FailedPreconditionError(msg);
}

absl::StatusOr<NamedTensors> ExportLlama(
    const std::map<std::string, Tensor>& params, const ModelConfig& config) {
  MCC_RETURN_IF_ERROR(CheckLlamaCompatible(config));
  const Dims m = DimsOf(config);
  NamedTensors out;
  for (const Entry& e : Table(config)) {
    MCC_ASSIGN_OR_RETURN(Tensor t, FindTensorOfShape(params, e.ours, e.shape,
                                                     "Llama export: parameter",
                                                     /*to_cpu=*/true));
    const std::vector<Shape> shapes = HfShapes(e, m, config);
    switch (e.kind) {
      case Kind::kCopy:
        out.emplace_back(e.hf[0], t.Clone());
        break;
      case Kind::kVocab: {
        MCC_ASSIGN_OR_RETURN(Tensor kept, KeepRows(t, HfVocabRows(config)));
        out.emplace_back(e.hf[0], kept);
        break;
      }
      case Kind::kQkv:
      case Kind::kQkvBias: {
        Tensor q = Tensor::Empty(shapes[0], t.dtype());
        Tensor k = Tensor::Empty(shapes[1], t.dtype());
        Tensor v = Tensor::Empty(shapes[2], t.dtype());
        MapQkv(m, /*to_hf=*/true, &t, &q, &k, &v);
        out.emplace_back(e.hf[0], q);
        out.emplace_back(e.hf[1], k);
        out.emplace_back(e.hf[2], v);
        break;
      }
      case Kind::kFc1:
        for (int part = 0; part < 2; ++part) {
          MCC_ASSIGN_OR_RETURN(Tensor half, t.Slice(part, part + 1));
          MCC_ASSIGN_OR_RETURN(half, half.Clone().Reshape(shapes[part]));
          out.emplace_back(e.hf[part], half);
        }
        break;
      case Kind::kExpertsFc1:
      case Kind::kExpertsFc2:
      case Kind::kSharedFc1: {
        // Rows of the last dimension; each HF tensor is `rows` of them.
        const int64_t cols = e.shape.back();
        const size_t row = cols * DTypeSize(t.dtype());
        for (size_t i = 0; i < e.hf.size(); ++i) {
          const int64_t rows = shapes[i][0];
          Tensor part = Tensor::Empty(shapes[i], t.dtype());
          CopyRows(t, static_cast<int64_t>(i) * rows, &part, 0, rows, row);
          out.emplace_back(e.hf[i], part);
        }
        break;
      }
    }
  }
  return out;
}

absl::StatusOr<std::map<std::string, Tensor>> ImportLlama(
    const NamedTensors& hf, const ModelConfig& config) {
  MCC_RETURN_IF_ERROR(CheckLlamaCompatible(config));
  // Each layer has 9 tensors: a configuration with more layers than the
  // file can hold fails here, before its tensor table is made.
  if (config.num_layers() < 0 ||
      config.num_layers() > static_cast<int64_t>(hf.size()) / 9) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Llama import: the configuration has ", config.num_layers(),
        " layers (9 tensors each) but the files hold ", hf.size(), " tensors"));
  }
  std::map<std::string, Tensor> by_name;
  for (const auto& [name, t] : hf) by_name[name] = t;
  const Dims m = DimsOf(config);
  std::map<std::string, Tensor> out;
  for (const Entry& e : Table(config)) {
    const std::vector<Shape> shapes = HfShapes(e, m, config);
    std::vector<Tensor> parts;
    for (size_t i = 0; i < e.hf.size(); ++i) {
      MCC_ASSIGN_OR_RETURN(const Tensor t,
                           FindTensorOfShape(by_name, e.hf[i], shapes[i],
                                             "Llama import: tensor"));
      Tensor f32 = t;
      if (t.dtype() != DType::kFloat32) {
        MCC_ASSIGN_OR_RETURN(f32, t.To(DType::kFloat32));
      }
      parts.push_back(f32);
    }
    Tensor r;
    switch (e.kind) {
      case Kind::kCopy:
        r = parts[0].Clone();
        break;
      case Kind::kVocab:
        r = PadRows(parts[0], e.shape);
        break;
      case Kind::kQkv:
      case Kind::kQkvBias:
        r = Tensor::Empty(e.shape, DType::kFloat32);
        MapQkv(m, /*to_hf=*/false, &r, &parts[0], &parts[1], &parts[2]);
        break;
      case Kind::kFc1:
        r = Tensor::Empty(e.shape, DType::kFloat32);
        std::memcpy(r.raw_data(), parts[0].raw_data(), parts[0].nbytes());
        std::memcpy(static_cast<char*>(r.raw_data()) + parts[0].nbytes(),
                    parts[1].raw_data(), parts[1].nbytes());
        break;
      case Kind::kExpertsFc1:
      case Kind::kExpertsFc2:
      case Kind::kSharedFc1: {
        r = Tensor::Empty(e.shape, DType::kFloat32);
        const size_t row = e.shape.back() * sizeof(float);
        for (size_t i = 0; i < parts.size(); ++i) {
          const int64_t rows = shapes[i][0];
          CopyRows(parts[i], 0, &r, static_cast<int64_t>(i) * rows, rows, row);
        }
        break;
      }
    }
    out[e.ours] = r;
  }
  return out;
}

absl::StatusOr<ModelConfig> ParseLlamaConfigJson(absl::string_view text,
                                                 const std::string& path) {
  MCC_ASSIGN_OR_RETURN(const JsonDocument hf, ParseHfConfigJson(text, path));
  const std::string model_type =
      hf.contains("model_type") && hf["model_type"].is_string()
          ? hf["model_type"].get<std::string>()
          : "llama";
  if (model_type != "llama" && model_type != "mistral" &&
      model_type != "qwen2" && model_type != "qwen3" &&
      model_type != "mixtral" && model_type != "qwen2_moe" &&
      model_type != "qwen3_moe") {
    return absl::UnimplementedError(
        absl::StrCat(path, ": \"model_type\" \"", model_type,
                     "\" is not llama, mistral, qwen2, qwen3, mixtral, "
                     "qwen2_moe or qwen3_moe"));
  }
  // Qwen2-MoE: Qwen2's attention (q/k/v biases) with Qwen3-MoE's layer
  // choice, plus a shared expert behind a sigmoid gate.
  const bool qwen2_moe = model_type == "qwen2_moe";
  const bool qwen2 = model_type == "qwen2" || qwen2_moe;
  const bool mixtral = model_type == "mixtral";
  const bool qwen3_moe = model_type == "qwen3_moe";
  const bool qwen3 = model_type == "qwen3" || qwen3_moe;
  // Mistral's sliding_window: the keys a query sees, itself included (null:
  // no window).
  int64_t sliding_window = 0;
  if (model_type == "mistral") {
    MCC_ASSIGN_OR_RETURN(sliding_window,
                         JsonPositiveInt(hf, "sliding_window", path, 0));
  }
  if (mixtral) {
    if (hf.contains("sliding_window") && !hf["sliding_window"].is_null()) {
      return absl::UnimplementedError(absl::StrCat(
          path, ": \"sliding_window\" ", hf["sliding_window"].dump(),
          " is set; a Mixtral with a sliding window is not supported"));
    }
  } else if (qwen2 || qwen3) {
    MCC_ASSIGN_OR_RETURN(bool sliding,
                         JsonBool(hf, "use_sliding_window", path, false));
    if (sliding) {
      return absl::UnimplementedError(
          absl::StrCat(path,
                       ": \"use_sliding_window\" is true; sliding-window "
                       "attention is not supported"));
    }
  }
  auto need = [&](const char* key) {
    return JsonPositiveInt(hf, key, path, std::nullopt);
  };
  MCC_ASSIGN_OR_RETURN(int64_t vocab, need("vocab_size"));
  MCC_ASSIGN_OR_RETURN(int64_t hidden, need("hidden_size"));
  MCC_ASSIGN_OR_RETURN(int64_t ffn, need("intermediate_size"));
  MCC_ASSIGN_OR_RETURN(int64_t layers, need("num_hidden_layers"));
  MCC_ASSIGN_OR_RETURN(int64_t heads, need("num_attention_heads"));
  MCC_ASSIGN_OR_RETURN(int64_t positions, need("max_position_embeddings"));
  MCC_ASSIGN_OR_RETURN(int64_t groups,
                       JsonPositiveInt(hf, "num_key_value_heads", path, heads));
  MCC_ASSIGN_OR_RETURN(double eps,
                       JsonPositiveNumber(hf, "rms_norm_eps", path, 1e-6));
  MCC_ASSIGN_OR_RETURN(double theta,
                       JsonPositiveNumber(hf, "rope_theta", path, 10000.0));
  MCC_ASSIGN_OR_RETURN(bool tied,
                       JsonBool(hf, "tie_word_embeddings", path, false));
  if (hidden % heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"hidden_size\" ", hidden,
                     " is not a multiple of \"num_attention_heads\" ", heads));
  }
  if (heads % groups != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"num_attention_heads\" ", heads,
                     " is not a multiple of \"num_key_value_heads\" ", groups));
  }
  // Qwen3Config's head_dim defaults to 128, the others' to hidden / heads.
  MCC_ASSIGN_OR_RETURN(
      int64_t head_dim,
      JsonPositiveInt(hf, "head_dim", path, qwen3 ? 128 : hidden / heads));
  if (head_dim != hidden / heads) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": \"head_dim\" ", head_dim,
                     " differs from hidden_size / num_attention_heads (",
                     hidden / heads, "); only that head size is supported"));
  }
  if (hf.contains("hidden_act") && !hf["hidden_act"].is_null() &&
      hf["hidden_act"] != "silu") {
    return absl::UnimplementedError(absl::StrCat(
        path, ": \"hidden_act\" ", hf["hidden_act"].dump(),
        " is not \"silu\" (SwiGLU), the only activation supported"));
  }
  MCC_ASSIGN_OR_RETURN(std::optional<checkpoint::RopeScaling> rope_scaling,
                       ParseRopeScaling(hf, path));
  if (qwen2_moe) {
    // Newer Qwen2MoeConfig's switch for the q/k/v biases (true by default).
    MCC_ASSIGN_OR_RETURN(bool qkv_bias, JsonBool(hf, "qkv_bias", path, true));
    if (!qkv_bias) {
      return absl::UnimplementedError(absl::StrCat(
          path,
          ": \"qkv_bias\" is false; only Qwen2-MoE with q/k/v biases "
          "is supported"));
    }
  }
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    if (qwen2) break;  // Qwen2 has neither key: q/k/v biases, no others.
    MCC_ASSIGN_OR_RETURN(bool has, JsonBool(hf, bias, path, false));
    if (has) {
      return absl::UnimplementedError(
          absl::StrCat(path, ": \"", bias,
                       "\" is true; only Llama without biases is "
                       "supported"));
    }
  }
  // Mixture of experts: Mixtral's every layer; Qwen3-MoE's and
  // Qwen2-MoE's every decoder_sparse_step-th (counted from 1) not in
  // mlp_only_layers.
  int64_t experts = 0, topk = 0, expert_ffn = 0, shared_ffn = 0;
  bool normalize_topk = true;
  std::vector<bool> moe_layers;
  if (mixtral || qwen3_moe || qwen2_moe) {
    MCC_ASSIGN_OR_RETURN(experts,
                         need(mixtral ? "num_local_experts" : "num_experts"));
    MCC_ASSIGN_OR_RETURN(topk, need("num_experts_per_tok"));
    if (topk > experts) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"num_experts_per_tok\" ", topk,
                       " exceeds the ", experts, " experts"));
    }
    MCC_ASSIGN_OR_RETURN(expert_ffn, mixtral ? need("intermediate_size")
                                             : need("moe_intermediate_size"));
    moe_layers.assign(layers, true);
    if (qwen2_moe) {
      MCC_ASSIGN_OR_RETURN(shared_ffn, need("shared_expert_intermediate_size"));
    }
    if (qwen3_moe || qwen2_moe) {
      // False (the configs' default): the top-k of the softmax over every
      // expert, as they are (--moe-router-pre-softmax).
      MCC_ASSIGN_OR_RETURN(normalize_topk,
                           JsonBool(hf, "norm_topk_prob", path, false));
      MCC_ASSIGN_OR_RETURN(int64_t step,
                           JsonPositiveInt(hf, "decoder_sparse_step", path, 1));
      for (int64_t i = 0; i < layers; ++i) moe_layers[i] = (i + 1) % step == 0;
      if (hf.contains("mlp_only_layers") && !hf["mlp_only_layers"].is_null()) {
        const JsonDocument& dense = hf["mlp_only_layers"];
        if (!dense.is_array()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": \"mlp_only_layers\" ", dense.dump(),
                           " is not a list of layer numbers"));
        }
        for (const auto& layer : dense) {
          if (!layer.is_number_integer() || layer.get<int64_t>() < 0 ||
              layer.get<int64_t>() >= layers) {
            return absl::InvalidArgumentError(
                absl::StrCat(path, ": \"mlp_only_layers\" holds ", layer.dump(),
                             ", not a layer number below ", layers));
          }
          moe_layers[layer.get<int64_t>()] = false;
        }
      }
    }
  }
  ModelConfig config;
  if (experts > 0) {
    config.set_num_experts(experts);
    config.set_moe_router_topk(topk);
    config.set_moe_ffn_hidden_size(expert_ffn);
    config.set_moe_layer_pattern(MoePattern(moe_layers));
    config.set_moe_router_score_function("softmax");
    config.set_moe_router_pre_softmax(!normalize_topk);
    if (shared_ffn > 0) {
      config.set_moe_shared_expert_intermediate_size(shared_ffn);
      config.set_moe_shared_expert_gate(true);
    }
  }
  config.set_num_layers(layers);
  config.set_hidden_size(hidden);
  config.set_num_attention_heads(heads);
  config.set_num_query_groups(groups);
  config.set_ffn_hidden_size(ffn);
  config.set_vocab_size(vocab);
  config.set_padded_vocab_size(vocab);  // The rows stored: no padding.
  config.set_seq_length(positions);
  config.set_max_position_embeddings(positions);
  config.set_position_embedding_type(checkpoint::POSITION_EMBEDDING_ROPE);
  config.set_normalization(checkpoint::NORMALIZATION_RMS_NORM);
  config.set_activation(checkpoint::ACTIVATION_SWIGLU);
  config.set_tied_embeddings(tied);
  config.set_add_bias_linear(false);
  config.set_add_qkv_bias(qwen2);
  config.set_qk_layernorm(qwen3);
  config.set_sliding_window(sliding_window);
  config.set_layernorm_epsilon(eps);
  config.set_rotary_base(theta);
  if (rope_scaling.has_value()) *config.mutable_rope_scaling() = *rope_scaling;
  return config;
}

std::string HfArchitecture(const ModelConfig& c) {
  if (c.num_experts() > 0) {
    if (c.qk_layernorm()) return "Qwen3MoeForCausalLM";
    return c.add_qkv_bias() ? "Qwen2MoeForCausalLM" : "MixtralForCausalLM";
  }
  if (c.qk_layernorm()) return "Qwen3ForCausalLM";
  if (c.add_qkv_bias()) return "Qwen2ForCausalLM";
  return c.sliding_window() > 0 ? "MistralForCausalLM" : "LlamaForCausalLM";
}

std::string LlamaConfigJson(const ModelConfig& c, DType dtype) {
  const Dims m = DimsOf(c);
  const char* torch_dtype = dtype == DType::kBFloat16  ? "bfloat16"
                            : dtype == DType::kFloat16 ? "float16"
                                                       : "float32";
  const std::string architecture = HfArchitecture(c);
  const bool llama = architecture == "LlamaForCausalLM";
  const bool qwen2_moe = architecture == "Qwen2MoeForCausalLM";
  // Qwen2-MoE's attention is Qwen2's (no head_dim, no attention_bias).
  const bool qwen2 = architecture == "Qwen2ForCausalLM" || qwen2_moe;
  const bool mixtral = architecture == "MixtralForCausalLM";
  const bool qwen3_moe = architecture == "Qwen3MoeForCausalLM";
  const bool qwen3 = architecture == "Qwen3ForCausalLM";
  const bool mistral = architecture == "MistralForCausalLM";
  if (mistral) {
    // MistralConfig's keys, in its order.
    nlohmann::ordered_json config = {
        {"architectures", nlohmann::ordered_json::array({architecture})},
        {"model_type", "mistral"},
        {"vocab_size", HfVocabRows(c)},
        {"hidden_size", c.hidden_size()},
        {"intermediate_size", c.ffn_hidden_size()},
        {"num_hidden_layers", c.num_layers()},
        {"num_attention_heads", m.heads},
        {"num_key_value_heads", m.groups},
        {"head_dim", m.d},
        {"hidden_act", "silu"},
        {"max_position_embeddings", c.max_position_embeddings()},
        {"rms_norm_eps", c.layernorm_epsilon()},
        {"rope_theta", c.rotary_base()},
        {"sliding_window", c.sliding_window()},
        {"attention_dropout", 0.0},
        {"tie_word_embeddings", c.tied_embeddings()},
        {"torch_dtype", torch_dtype}};
    return config.dump(2) + "\n";
  }
  // ordered_json: the keys in Hugging Face's order; doubles round-trip.
  nlohmann::ordered_json config = {
      {"architectures", nlohmann::ordered_json::array({architecture})},
      {"model_type", llama       ? "llama"
                     : qwen3     ? "qwen3"
                     : mixtral   ? "mixtral"
                     : qwen3_moe ? "qwen3_moe"
                     : qwen2_moe ? "qwen2_moe"
                                 : "qwen2"},
      {"vocab_size", HfVocabRows(c)},
      {"hidden_size", c.hidden_size()},
      // Mixtral's experts are its only MLPs.
      {"intermediate_size",
       mixtral ? c.moe_ffn_hidden_size() : c.ffn_hidden_size()},
      {"num_hidden_layers", c.num_layers()},
      {"num_attention_heads", m.heads},
      {"num_key_value_heads", m.groups}};
  if (mixtral) {
    config["num_local_experts"] = c.num_experts();
    config["num_experts_per_tok"] = c.moe_router_topk();
    config["output_router_logits"] = false;
  }
  if (qwen3_moe || qwen2_moe) {
    config["num_experts"] = c.num_experts();
    config["num_experts_per_tok"] = c.moe_router_topk();
    config["moe_intermediate_size"] = c.moe_ffn_hidden_size();
    if (qwen2_moe) {
      config["shared_expert_intermediate_size"] =
          c.moe_shared_expert_intermediate_size();
    }
    config["norm_topk_prob"] = !c.moe_router_pre_softmax();
    config["decoder_sparse_step"] = 1;
    nlohmann::ordered_json dense = nlohmann::ordered_json::array();
    if (auto layers = MoeLayers(c)) {
      for (size_t i = 0; i < layers->size(); ++i) {
        if (!(*layers)[i]) dense.push_back(i);
      }
    }
    config["mlp_only_layers"] = dense;
    config["output_router_logits"] = false;
  }
  // Qwen2Config has neither head_dim nor attention_bias.
  if (!qwen2) config["head_dim"] = m.d;
  config["hidden_act"] = "silu";
  config["max_position_embeddings"] = c.max_position_embeddings();
  config["rms_norm_eps"] = c.layernorm_epsilon();
  config["rope_theta"] = c.rotary_base();
  config["rope_scaling"] = RopeScalingJson(c);
  if (!qwen2) config["attention_bias"] = false;
  if (llama) {
    config["mlp_bias"] = false;
  } else if (mixtral) {
    config["sliding_window"] = nullptr;
  } else {
    config["use_sliding_window"] = false;
  }
  config["attention_dropout"] = 0.0;
  config["tie_word_embeddings"] = c.tied_embeddings();
  config["torch_dtype"] = torch_dtype;
  return config.dump(2) + "\n";
}

absl::StatusOr<NamedTensors> ExportCheckpointToHfLlama(
    CheckpointReader& reader) {
  const ModelConfig& config = reader.common_state().model();
  MCC_RETURN_IF_ERROR(CheckLlamaCompatible(config));
  std::map<std::string, Tensor> params;
  for (const Entry& e : Table(config)) {
    MCC_ASSIGN_OR_RETURN(params[e.ours], reader.ReadTensor(e.ours));
  }
  return ExportLlama(params, config);
}

}  // namespace mcc
