#include "inference/inference_weights.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/fp8.h"
#include "core/parameter.h"
#include "core/status_macros.h"
#include "models/gpt/transformer_layer.h"
#include "parallel/linear.h"
#include "parallel/mappings.h"

namespace mcc {
namespace inference {
namespace {

using Params = std::map<std::string, const Parameter*>;

absl::StatusOr<const Parameter*> Find(const Params& params,
                                      const std::string& name) {
  auto it = params.find(name);
  if (it == params.end()) {
    return absl::NotFoundError(
        absl::StrCat("inference weights: the model has no parameter ", name));
  }
  return it->second;
}

absl::StatusOr<std::vector<float>> Floats(const Params& params,
                                          const std::string& name) {
  auto p = Find(params, name);
  if (!p.ok()) return p.status();
  return (*p)->value.ToFloats();
}

// The int8 values and scales of a layer that ConvertToInt8 turned int8.
absl::Status CopyInt8(const parallel::Int8Weight& int8,
                      const std::string& prefix, LinearWeights* lin) {
  const Tensor& q = int8.q->value;
  const Tensor& scales = int8.scales->value;
  if (!q.defined() || !scales.defined() || q.dim() < 2 ||
      scales.numel() * q.size(q.dim() - 1) != q.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inference weights: ", prefix, ".weight's int8 values ",
        q.defined() ? q.Describe() : "(none)", " and scales ",
        scales.defined() ? scales.Describe() : "(none)", " do not match"));
  }
  lin->in = q.size(q.dim() - 1);
  lin->out = q.numel() / lin->in;
  // |q| <= 127 round-trips through fp32 exactly, on any device.
  const std::vector<float> values = q.ToFloats();
  lin->q.assign(values.begin(), values.end());
  lin->scales = scales.ToFloats();
  return absl::OkStatus();
}

// The dense fp32 values e4m3(code) / s of a layer ConvertToFp8 turned FP8:
// the CPU engine has no FP8 kernel, so it computes with these (the model's
// weights stay one byte each; this copy is fp32 as every dense one); and
// the codes and scales themselves, which the device engine computes with.
absl::Status CopyFp8Dequantised(const parallel::Fp8Weight& fp8,
                                const std::string& prefix, LinearWeights* lin) {
  const Tensor& q = fp8.q->value;
  const Tensor& scales = fp8.scales->value;
  if (!q.defined() || !scales.defined() || q.dim() < 2 ||
      scales.numel() * q.size(q.dim() - 1) != q.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inference weights: ", prefix,
                     ".weight's FP8 codes and scales do "
                     "not match"));
  }
  lin->in = q.size(q.dim() - 1);
  lin->out = q.numel() / lin->in;
  const std::vector<double> codes = q.ToDoubles();
  const std::vector<float> s = scales.ToFloats();
  lin->weight.resize(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    const auto code = static_cast<uint8_t>(static_cast<int8_t>(codes[i]));
    lin->weight[i] = Fp8ToFloat(code, Fp8Format::kE4M3) / s[i / lin->in];
  }
  lin->fp8_codes.assign(codes.begin(), codes.end());
  lin->fp8_scales = s;
  return absl::OkStatus();
}

absl::StatusOr<LinearWeights> Linear(const Params& params,
                                     const std::string& prefix, bool bias,
                                     const parallel::Int8Weight* int8,
                                     const parallel::Fp8Weight* fp8) {
  LinearWeights lin;
  if (int8 != nullptr) {
    MCC_RETURN_IF_ERROR(CopyInt8(*int8, prefix, &lin));
  } else if (fp8 != nullptr) {
    MCC_RETURN_IF_ERROR(CopyFp8Dequantised(*fp8, prefix, &lin));
  } else {
    auto w = Find(params, prefix + ".weight");
    if (!w.ok()) return w.status();
    const Tensor& value = (*w)->value;
    // A stacked weight [parts, out, in] (SwiGLU's gate and up) computes its
    // parts' outputs one after another, as one [parts * out, in] matrix.
    if (!value.defined() || (value.dim() != 2 && value.dim() != 3)) {
      return absl::InvalidArgumentError(
          absl::StrCat("inference weights: ", prefix, ".weight ",
                       value.defined() ? value.Describe() : "(no values)",
                       " is not a matrix"));
    }
    lin.in = value.size(value.dim() - 1);
    lin.out = value.numel() / lin.in;
    lin.weight = value.ToFloats();
  }
  if (bias) {
    auto b = Floats(params, prefix + ".bias");
    if (!b.ok()) return b.status();
    lin.bias = std::move(*b);
  }
  return lin;
}

absl::StatusOr<NormWeights> NormOf(const Params& params,
                                   const std::string& prefix, bool layer_norm) {
  NormWeights norm;
  auto w = Floats(params, prefix + ".weight");
  if (!w.ok()) return w.status();
  norm.weight = std::move(*w);
  if (layer_norm) {
    auto b = Floats(params, prefix + ".bias");
    if (!b.ok()) return b.status();
    norm.bias = std::move(*b);
  }
  return norm;
}

// The experts of a stacked [E, rows, cols] weight, one matrix each.
std::vector<LinearWeights> PerExpert(const Tensor& stacked) {
  const int64_t e = stacked.size(0), rows = stacked.size(1),
                cols = stacked.size(2);
  const std::vector<float> all = stacked.ToFloats();
  std::vector<LinearWeights> out(e);
  for (int64_t i = 0; i < e; ++i) {
    out[i].out = rows;
    out[i].in = cols;
    out[i].weight.assign(all.begin() + i * rows * cols,
                         all.begin() + (i + 1) * rows * cols);
  }
  return out;
}

LinearWeights Whole(const Parameter& p) {
  LinearWeights lin;
  lin.out = p.value.size(0);
  lin.in = p.value.size(1);
  lin.weight = p.value.ToFloats();
  return lin;
}

absl::StatusOr<MoeWeights> MoeOf(const moe::MoeMlp& moe) {
  MoeWeights m;
  m.router = moe.config().router;
  m.router_weight = moe.router_weight().value.ToFloats();
  if (moe.expert_bias().defined()) {
    m.expert_bias = moe.expert_bias().ToFloats();
  }
  m.fc1 = PerExpert(moe.fc1_weight().value);
  m.fc2 = PerExpert(moe.fc2_weight().value);
  if (moe.shared_fc1_weight() != nullptr) {
    m.shared_fc1 = Whole(*moe.shared_fc1_weight());
    m.shared_fc2 = Whole(*moe.shared_fc2_weight());
  }
  if (moe.shared_gate_weight() != nullptr) {
    m.shared_gate = moe.shared_gate_weight()->value.ToFloats();
  }
  return m;
}

}  // namespace

absl::StatusOr<InferenceWeights> LoadInferenceWeights(
    const gpt::GPTModel& model) {
  InferenceWeights w;
  w.config = model.config();
  const gpt::GPTConfig& c = w.config;
  comm::ProcessGroup* tp = model.context().tp_group;
  w.tp_size = std::max(1, parallel::GroupSize(tp));
  w.tp_rank = parallel::GroupRank(tp);
  w.first_layer = model.chunk().first_layer;
  w.pre_process = model.chunk().pre_process;
  w.post_process = model.chunk().post_process;
  w.local_heads = c.num_attention_heads / w.tp_size;
  w.local_groups = c.query_groups() / w.tp_size;
  Params params;
  for (const auto& p : model.parameters()) params[p->name] = p.get();
  const bool tied = !c.untie_embeddings_and_output_weights;
  const bool layer_norm = c.normalization == gpt::Normalization::kLayerNorm;
  const bool bias = c.add_bias_linear;
  w.vocab_rows = c.padded_vocab_size(w.tp_size) / w.tp_size;
  w.vocab_start = w.tp_rank * w.vocab_rows;
  if (w.pre_process || (w.post_process && tied)) {
    auto e = Floats(params, "embedding.word_embeddings.weight");
    if (!e.ok()) return e.status();
    w.word_embeddings = std::move(*e);
    if (static_cast<int64_t>(w.word_embeddings.size()) !=
        w.vocab_rows * c.hidden_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("inference weights: the word embedding holds ",
                       w.word_embeddings.size(), " values, not ", w.vocab_rows,
                       " rows of ", c.hidden_size));
    }
  }
  if (w.pre_process &&
      c.position_embedding == gpt::PositionEmbedding::kLearned) {
    auto e = Floats(params, "embedding.position_embeddings.weight");
    if (!e.ok()) return e.status();
    w.position_embeddings = std::move(*e);
  }
  const int num_layers = static_cast<int>(model.units().size()) -
                         (w.pre_process ? 1 : 0) - (w.post_process ? 1 : 0);
  for (int i = w.first_layer; i < w.first_layer + num_layers; ++i) {
    const std::string prefix = absl::StrCat("decoder.layers.", i, ".");
    LayerWeights layer;
    auto ln1 = NormOf(params, prefix + "input_layernorm", layer_norm);
    auto ln2 = NormOf(params, prefix + "pre_mlp_layernorm", layer_norm);
    const gpt::TransformerLayer* t = model.layer(i - w.first_layer);
    auto qkv = Linear(params, prefix + "self_attention.linear_qkv",
                      c.qkv_bias(), t->qkv_int8(), t->qkv_fp8());
    auto proj = Linear(params, prefix + "self_attention.linear_proj", bias,
                       t->proj_int8(), t->proj_fp8());
    absl::StatusOr<LinearWeights> fc1 = LinearWeights(), fc2 = LinearWeights();
    if (const moe::MoeMlp* moe = t->moe()) {
      auto m = MoeOf(*moe);
      if (!m.ok()) return m.status();
      layer.moe = std::move(*m);
    } else {
      fc1 = Linear(params, prefix + "mlp.linear_fc1", bias, t->fc1_int8(),
                   t->fc1_fp8());
      fc2 = Linear(params, prefix + "mlp.linear_fc2", bias, t->fc2_int8(),
                   t->fc2_fp8());
    }
    for (const absl::Status& s : {ln1.status(), ln2.status(), qkv.status(),
                                  proj.status(), fc1.status(), fc2.status()}) {
      if (!s.ok()) return s;
    }
    if (c.qk_layernorm) {
      auto qn =
          NormOf(params, prefix + "self_attention.q_layernorm", layer_norm);
      if (!qn.ok()) return qn.status();
      auto kn =
          NormOf(params, prefix + "self_attention.k_layernorm", layer_norm);
      if (!kn.ok()) return kn.status();
      layer.q_norm = std::move(*qn);
      layer.k_norm = std::move(*kn);
    }
    layer.ln1 = std::move(*ln1);
    layer.ln2 = std::move(*ln2);
    layer.qkv = std::move(*qkv);
    layer.proj = std::move(*proj);
    layer.fc1 = std::move(*fc1);
    layer.fc2 = std::move(*fc2);
    w.layers.push_back(std::move(layer));
  }
  if (w.post_process) {
    auto n = NormOf(params, "decoder.final_layernorm", layer_norm);
    if (!n.ok()) return n.status();
    w.final_norm = std::move(*n);
    if (!tied) {
      auto o = Floats(params, "output_layer.weight");
      if (!o.ok()) return o.status();
      w.output = std::move(*o);
    }
  }
  return w;
}

}  // namespace inference
}  // namespace mcc
