#include "models/gpt/transformer_layer.h"

#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/bias.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/layout.h"
#include "core/ops/norm.h"
#include "core/ops/rotary.h"
#include "core/status_macros.h"
#include "parallel/context_parallel/chunk_layout.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/mappings.h"

namespace mcc {
namespace gpt {

using parallel::ColumnParallelLinear;
using parallel::GroupRank;
using parallel::GroupSize;
using parallel::InitSpec;
using parallel::LinearOptions;
using parallel::MakeParameter;
using parallel::RowParallelLinear;

absl::StatusOr<std::unique_ptr<Norm>> Norm::Create(
    const std::string& name, const GPTConfig& config,
    const parallel::LayerContext& context) {
  auto norm = std::unique_ptr<Norm>(new Norm);
  norm->kind_ = config.normalization;
  norm->eps_ = static_cast<float>(config.norm_epsilon);
  const bool sp = context.sequence_parallel && GroupSize(context.tp_group) > 1;
  MCC_ASSIGN_OR_RETURN(norm->weight_,
                       MakeParameter(name + ".weight", {config.hidden_size}, -1,
                                     InitSpec::Ones(), context, false));
  norm->weight_->sequence_parallel = sp;
  if (config.normalization == Normalization::kLayerNorm) {
    MCC_ASSIGN_OR_RETURN(norm->bias_,
                         MakeParameter(name + ".bias", {config.hidden_size}, -1,
                                       InitSpec::Zeros(), context, false));
    norm->bias_->sequence_parallel = sp;
  }
  return norm;
}

absl::StatusOr<std::unique_ptr<Norm>> Norm::CreatePerHead(
    const std::string& name, const GPTConfig& config,
    const parallel::LayerContext& context) {
  auto norm = std::unique_ptr<Norm>(new Norm);
  norm->kind_ = config.normalization;
  norm->eps_ = static_cast<float>(config.norm_epsilon);
  // Partial on every TP rank (its own heads), with or without SP.
  const bool partial = GroupSize(context.tp_group) > 1;
  MCC_ASSIGN_OR_RETURN(norm->weight_,
                       MakeParameter(name + ".weight", {config.head_dim()}, -1,
                                     InitSpec::Ones(), context, false));
  norm->weight_->sequence_parallel = partial;
  if (config.normalization == Normalization::kLayerNorm) {
    MCC_ASSIGN_OR_RETURN(norm->bias_,
                         MakeParameter(name + ".bias", {config.head_dim()}, -1,
                                       InitSpec::Zeros(), context, false));
    norm->bias_->sequence_parallel = partial;
  }
  return norm;
}

absl::StatusOr<Tensor> Norm::Forward(const Tensor& x, Activations* act) const {
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  act->input = x;
  act->rstd = Tensor::Empty({x.size(0)}, DType::kFloat32, x.device());
  if (kind_ == Normalization::kLayerNorm) {
    act->mean = Tensor::Empty({x.size(0)}, DType::kFloat32, x.device());
    MCC_RETURN_IF_ERROR(ops::LayerNormForward(
        x, weight_->value, bias_->value, eps_, &y, &act->mean, &act->rstd));
  } else {
    MCC_RETURN_IF_ERROR(
        ops::RMSNormForward(x, weight_->value, eps_, &y, &act->rstd));
  }
  return y;
}

absl::StatusOr<Tensor> Norm::Backward(const Tensor& dy,
                                      const Activations& act) const {
  Tensor dx =
      Tensor::Empty(act.input.shape(), act.input.dtype(), act.input.device());
  if (kind_ == Normalization::kLayerNorm) {
    MCC_RETURN_IF_ERROR(ops::LayerNormBackward(
        dy, act.input, weight_->value, act.mean, act.rstd, &dx,
        &weight_->main_grad, &bias_->main_grad));
  } else {
    MCC_RETURN_IF_ERROR(ops::RMSNormBackward(
        dy, act.input, weight_->value, act.rstd, &dx, &weight_->main_grad));
  }
  return dx;
}

void Norm::AppendParameters(ParameterList* out) const {
  out->push_back(weight_);
  if (bias_ != nullptr) out->push_back(bias_);
}

std::vector<Tensor*> TransformerLayer::Activations::Tensors() {
  std::vector<Tensor*> out = {
      &ln1.input, &ln1.mean,   &ln1.rstd,   &ln2.input, &ln2.mean, &ln2.rstd,
      &qkv.input, &fc1.input,  &proj.input, &fc2.input, &q,        &k,
      &v,         &attn_out,   &lse,        &fc1_out,   &cp_a2a.q, &cp_a2a.k,
      &cp_a2a.v,  &cp_a2a.out, &cp_a2a.lse};
  for (int c = 0; c < 2; ++c) {
    for (Norm::Activations* n : {&q_norm[c], &k_norm[c]}) {
      out.push_back(&n->input);
      out.push_back(&n->mean);
      out.push_back(&n->rstd);
    }
  }
  for (int c = 0; c < 2; ++c) {
    for (Tensor* t :
         {&cp_qkv.q[c], &cp_qkv.k[c], &cp_qkv.v[c], &cp_out[c], &cp_lse[c]}) {
      out.push_back(t);
    }
  }
  for (Tensor* t : {&moe.x, &moe.x32, &moe.logits, &moe.scores, &moe.indices,
                    &moe.weights, &moe.row_to_slot, &moe.slot_to_row,
                    &moe.permuted, &moe.fc1_out, &moe.act_out, &moe.expert_out,
                    &moe.shared_fc1_out, &moe.shared_act_out}) {
    out.push_back(t);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<TransformerLayer>> TransformerLayer::Create(
    int layer_number, const GPTConfig& config,
    const parallel::LayerContext& context) {
  const int tp = GroupSize(context.tp_group);
  MCC_RETURN_IF_ERROR(config.Validate(tp, context.sequence_parallel));
  if (GroupSize(context.cp_group) > 1 && config.attention_dropout > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention dropout ", config.attention_dropout,
        " with context parallelism (size ", GroupSize(context.cp_group),
        "): not supported; set --attention-dropout 0"));
  }
  const int cp = GroupSize(context.cp_group);
  if (cp > 1 &&
      context.cp_comm_type == parallel::LayerContext::CpCommType::kAllToAll &&
      ((config.num_attention_heads / tp) % cp != 0 ||
       (config.query_groups() / tp) % cp != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cp-comm-type a2a: the ", config.num_attention_heads / tp,
        " attention heads and ", config.query_groups() / tp,
        " query groups per tensor-parallel rank must divide by the "
        "context-parallel size ",
        cp, " (use --cp-comm-type p2p)"));
  }
  auto layer = std::unique_ptr<TransformerLayer>(new TransformerLayer);
  layer->config_ = config;
  layer->context_ = context;
  layer->local_heads_ = config.num_attention_heads / tp;
  layer->local_groups_ = config.query_groups() / tp;
  const std::string prefix = absl::StrCat("decoder.layers.", layer_number, ".");
  const float std = static_cast<float>(config.init_method_std);
  // Megatron scales the init of the layers that write into the residual
  // stream by 1 / sqrt(2 * layers).
  const float out_std = std / std::sqrt(2.0f * config.num_layers);
  const int64_t h = config.hidden_size;
  const int64_t d = config.head_dim();
  const int64_t heads_per_group =
      config.num_attention_heads / config.query_groups();
  const int64_t qkv_out = config.query_groups() * (heads_per_group + 2) * d;

  MCC_ASSIGN_OR_RETURN(
      layer->ln1_, Norm::Create(prefix + "input_layernorm", config, context));
  MCC_ASSIGN_OR_RETURN(
      layer->ln2_, Norm::Create(prefix + "pre_mlp_layernorm", config, context));
  if (config.qk_layernorm) {
    MCC_ASSIGN_OR_RETURN(
        layer->q_norm_,
        Norm::CreatePerHead(prefix + "self_attention.q_layernorm", config,
                            context));
    MCC_ASSIGN_OR_RETURN(
        layer->k_norm_,
        Norm::CreatePerHead(prefix + "self_attention.k_layernorm", config,
                            context));
  }
  LinearOptions qkv_options;
  qkv_options.bias = config.qkv_bias();
  qkv_options.weight_init = InitSpec::Normal(std);
  MCC_ASSIGN_OR_RETURN(layer->qkv_, ColumnParallelLinear::Create(
                                        prefix + "self_attention.linear_qkv", h,
                                        qkv_out, qkv_options, context));
  LinearOptions proj_options;
  proj_options.bias = config.add_bias_linear;
  proj_options.weight_init = InitSpec::Normal(out_std);
  MCC_ASSIGN_OR_RETURN(layer->proj_, RowParallelLinear::Create(
                                         prefix + "self_attention.linear_proj",
                                         config.num_attention_heads * d, h,
                                         proj_options, context));
  const bool swiglu = config.activation == Activation::kSwiGLU;
  if (config.IsMoeLayer(layer_number)) {
    MCC_ASSIGN_OR_RETURN(
        layer->moe_, CreateMoe(prefix + "mlp", layer_number, config, context));
    return layer;
  }
  LinearOptions fc1_options;
  fc1_options.bias = config.add_bias_linear;
  fc1_options.weight_init = InitSpec::Normal(std);
  // GELU fuses its bias; SwiGLU takes the biased output.
  fc1_options.skip_bias_add = !swiglu && config.add_bias_linear;
  // SwiGLU's gate and up projections, each split over TP.
  fc1_options.stacked = swiglu ? 2 : 1;
  MCC_ASSIGN_OR_RETURN(
      layer->fc1_,
      ColumnParallelLinear::Create(prefix + "mlp.linear_fc1", h,
                                   swiglu ? 2 * config.ffn() : config.ffn(),
                                   fc1_options, context));
  MCC_ASSIGN_OR_RETURN(layer->fc2_, RowParallelLinear::Create(
                                        prefix + "mlp.linear_fc2", config.ffn(),
                                        h, proj_options, context));
  return layer;
}

void TransformerLayer::AppendParameters(ParameterList* out) const {
  ln1_->AppendParameters(out);
  qkv_->AppendParameters(out);
  if (q_norm_ != nullptr) {
    q_norm_->AppendParameters(out);
    k_norm_->AppendParameters(out);
  }
  proj_->AppendParameters(out);
  ln2_->AppendParameters(out);
  if (moe_ != nullptr) {
    moe_->AppendParameters(out);
    return;
  }
  fc1_->AppendParameters(out);
  fc2_->AppendParameters(out);
}

absl::StatusOr<std::unique_ptr<moe::MoeMlp>> TransformerLayer::CreateMoe(
    const std::string& prefix, int layer_number, const GPTConfig& config,
    const parallel::LayerContext& context) {
  // Under SP each TP rank routes its own 1/TP of the tokens (Megatron's
  // layout; GPTConfig refuses token dropping there); without it every TP
  // rank routes all of them.
  const bool sp = context.sequence_parallel && GroupSize(context.tp_group) > 1;
  moe::MoeMlpConfig m;
  m.hidden_size = config.hidden_size;
  m.num_experts = config.num_experts;
  m.ffn_hidden_size = config.moe_ffn();
  m.shared_expert_ffn_hidden_size = config.moe_shared_expert_intermediate_size;
  m.router.topk = config.moe_router_topk;
  m.router.score_function = config.moe_router_score_function;
  m.expert_bias = config.moe_router_enable_expert_bias;
  // Without a shared expert the gate has nothing to scale, and sigmoid
  // scores are renormalised whatever the flag (Megatron's): both warned.
  m.shared_expert_gate = config.moe_shared_expert_gate &&
                         config.moe_shared_expert_intermediate_size > 0;
  m.router.normalize_topk =
      !(config.moe_router_pre_softmax &&
        config.moe_router_score_function == ops::MoeScoreFunction::kSoftmax);
  switch (config.moe_router_load_balancing_type) {
    case MoeLoadBalancing::kNone:
      m.load_balancing = moe::LoadBalancing::kNone;
      break;
    case MoeLoadBalancing::kAuxLoss:
      m.load_balancing = moe::LoadBalancing::kAuxLoss;
      break;
    case MoeLoadBalancing::kSeqAuxLoss:
      m.load_balancing = moe::LoadBalancing::kSeqAuxLoss;
      break;
  }
  m.capacity_factor = config.moe_expert_capacity_factor;
  {
    auto policy = moe::ParseTokenDropPolicy(config.moe_token_drop_policy);
    if (!policy.ok()) return policy.status();
    m.drop_policy = *policy;
  }
  m.aux_loss_coeff = static_cast<float>(config.moe_aux_loss_coeff);
  m.z_loss_coeff = static_cast<float>(config.moe_z_loss_coeff);
  m.activation = config.activation == Activation::kSwiGLU
                     ? moe::ExpertActivation::kSwiGLU
                     : moe::ExpertActivation::kGelu;
  m.dtype = context.dtype;
  m.device = context.device;
  m.init_std = static_cast<float>(config.init_method_std);
  // Every layer draws its own weights; every rank draws the same.
  m.seed = context.seed * 1000003u + 7919u * (layer_number + 1);
  m.context_parallel = context.cp_group;
  if (sp) m.sequence_parallel = context.tp_group;
  // The experts' layout (ParallelState's expert groups): E / EP experts
  // here, each split over ETP; whole experts otherwise.
  moe::ExpertParallelism ep;
  if (context.expert_layout) {
    ep.expert_model = context.expert_model_group;
    ep.expert_tensor = context.expert_tensor_group;
    ep.dispatcher = context.moe_alltoall_dispatcher
                        ? moe::TokenDispatcherType::kAllToAll
                        : moe::TokenDispatcherType::kAllGather;
  }
  auto created = moe::MoeMlp::Create(prefix, m, ep);
  if (!created.ok()) {
    return absl::Status(
        created.status().code(),
        absl::StrCat("layer ", layer_number,
                     " (--num-experts): ", created.status().message()));
  }
  moe::MoeMlp& layer = **created;
  if (context.expert_layout) {
    // Reduced over the expert-data-parallel group, not the dense one (under
    // SP that group spans the TP ranks too: their partial sums add there).
    layer.fc1_weight().expert_parallel = true;
    layer.fc2_weight().expert_parallel = true;
  }
  if (sp) {
    // Replicated over TP but applied to this rank's tokens only: partial
    // gradients, summed over TP as the norms' (the shared expert stays a
    // whole replicated MLP, not a TP-split one).
    ParameterList params;
    layer.AppendParameters(&params);
    for (const auto& p : params) {
      if (!p->expert_parallel) p->sequence_parallel = true;
    }
  }
  return created;
}

namespace {

// Row t of a [s * b, ...] tensor is (sequence t / b, batch t % b). These
// move head blocks of d elements between that order and [b, s, heads, d].
struct QkvLayout {
  int64_t b, s, groups, heads_per_group, d;
  int64_t row() const { return groups * (heads_per_group + 2) * d; }
};

// The copy of one part of q, k, v (part 0: q's heads_per_group heads of
// every group; 1: k; 2: v) between the QKV projection's output, rows
// [s, b] of [groups, heads_per_group + 2, d], and its [b, s, heads, d]
// tensor; merge copies the other way (the backward's dqkv).
ops::StridedCopyPlan QkvPlan(const QkvLayout& l, int part, bool merge) {
  const int64_t hpg = l.heads_per_group;
  const int64_t heads = part == 0 ? hpg : 1;
  const int64_t shape[5] = {l.b, l.s, l.groups, heads, l.d};
  const int64_t fused[5] = {l.row(), l.b * l.row(), (hpg + 2) * l.d, l.d, 1};
  const int64_t split[5] = {l.s * l.groups * heads * l.d,
                            l.groups * heads * l.d, heads * l.d, l.d, 1};
  ops::StridedCopyPlan p;
  p.rank = 5;
  for (int k = 0; k < 5; ++k) {
    p.shape[k] = shape[k];
    p.src_strides[k] = merge ? split[k] : fused[k];
    p.dst_strides[k] = merge ? fused[k] : split[k];
  }
  const int64_t fused_offset = part == 0 ? 0 : (hpg + part - 1) * l.d;
  (merge ? p.dst_offset : p.src_offset) = fused_offset;
  return p;
}

absl::Status SplitQkv(const Tensor& qkv, const QkvLayout& l, Tensor* q,
                      Tensor* k, Tensor* v) {
  MCC_RETURN_IF_ERROR(ops::CopyStrided(qkv, QkvPlan(l, 0, false), q));
  MCC_RETURN_IF_ERROR(ops::CopyStrided(qkv, QkvPlan(l, 1, false), k));
  return ops::CopyStrided(qkv, QkvPlan(l, 2, false), v);
}

absl::Status MergeQkv(const Tensor& q, const Tensor& k, const Tensor& v,
                      const QkvLayout& l, Tensor* qkv) {
  MCC_RETURN_IF_ERROR(ops::CopyStrided(q, QkvPlan(l, 0, true), qkv));
  MCC_RETURN_IF_ERROR(ops::CopyStrided(k, QkvPlan(l, 1, true), qkv));
  return ops::CopyStrided(v, QkvPlan(l, 2, true), qkv);
}

// [b, s, heads * d] <-> [s * b, heads * d].
absl::Status TransposeBatchSeq(const Tensor& src, int64_t b, int64_t s,
                               Tensor* dst, bool to_seq_major) {
  const int64_t row = src.numel() / (b * s);
  MCC_ASSIGN_OR_RETURN(Tensor from, to_seq_major ? src.Reshape({b, s, row})
                                                 : src.Reshape({s, b, row}));
  MCC_ASSIGN_OR_RETURN(Tensor to, to_seq_major ? dst->Reshape({s, b, row})
                                               : dst->Reshape({b, s, row}));
  return ops::Permute(from, {1, 0, 2}, &to);
}

}  // namespace

absl::Status TransformerLayer::QkNormForward(Tensor* q, Tensor* k, int chunk,
                                             Activations* act) const {
  if (q_norm_ == nullptr) return absl::OkStatus();
  const int64_t d = config_.head_dim();
  for (auto [x, norm, record] :
       {std::make_tuple(q, q_norm_.get(), &act->q_norm[chunk]),
        std::make_tuple(k, k_norm_.get(), &act->k_norm[chunk])}) {
    const Shape shape = x->shape();
    MCC_ASSIGN_OR_RETURN(Tensor rows, x->Reshape({x->numel() / d, d}));
    MCC_ASSIGN_OR_RETURN(Tensor y, norm->Forward(rows, record));
    MCC_ASSIGN_OR_RETURN(*x, y.Reshape(shape));
  }
  return absl::OkStatus();
}

absl::Status TransformerLayer::QkNormBackward(Tensor* dq, Tensor* dk, int chunk,
                                              const Activations& act) const {
  if (q_norm_ == nullptr) return absl::OkStatus();
  const int64_t d = config_.head_dim();
  for (auto [dx, norm, record] :
       {std::make_tuple(dq, q_norm_.get(), &act.q_norm[chunk]),
        std::make_tuple(dk, k_norm_.get(), &act.k_norm[chunk])}) {
    const Shape shape = dx->shape();
    MCC_ASSIGN_OR_RETURN(Tensor rows, dx->Reshape({dx->numel() / d, d}));
    MCC_ASSIGN_OR_RETURN(Tensor g, norm->Backward(rows, *record));
    MCC_ASSIGN_OR_RETURN(*dx, g.Reshape(shape));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> TransformerLayer::Dropout(const Tensor& x,
                                                 uint64_t offset) const {
  if (config_.hidden_dropout == 0.0 || !training_) return x;
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  MCC_RETURN_IF_ERROR(ops::Dropout(
      x, static_cast<float>(config_.hidden_dropout), config_.seed, offset, &y));
  return y;
}

absl::StatusOr<Tensor> TransformerLayer::DropoutBackward(
    const Tensor& dy, uint64_t offset) const {
  if (config_.hidden_dropout == 0.0) return dy;
  Tensor dx = Tensor::Empty(dy.shape(), dy.dtype(), dy.device());
  MCC_RETURN_IF_ERROR(
      ops::DropoutBackward(dy, static_cast<float>(config_.hidden_dropout),
                           config_.seed, offset, &dx));
  return dx;
}

int TransformerLayer::cp_size() const { return GroupSize(context_.cp_group); }
int TransformerLayer::cp_rank() const { return GroupRank(context_.cp_group); }

uint64_t TransformerLayer::DropoutShift(const Tensor& x) const {
  // Under SP this rank holds rows [rank * n, (rank + 1) * n) of its CP
  // rank's tokens: without CP its masks continue the serial model's stream
  // at that place. CP rank r takes the r-th S / C of each site's stretch,
  // so every token still gets its own mask (not the serial run's: its
  // tokens are chunks i and 2C - 1 - i).
  const bool sp = context_.sequence_parallel;
  const uint64_t tp_parts = sp ? GroupSize(context_.tp_group) : 1;
  const uint64_t tp_rank = sp ? GroupRank(context_.tp_group) : 0;
  return (static_cast<uint64_t>(cp_rank()) * tp_parts + tp_rank) *
         static_cast<uint64_t>(x.numel());
}

uint64_t TransformerLayer::DropoutSiteStride(const Tensor& x) const {
  const bool sp = context_.sequence_parallel;
  const uint64_t tp_parts = sp ? GroupSize(context_.tp_group) : 1;
  return static_cast<uint64_t>(x.numel()) * tp_parts * cp_size();
}

absl::Status TransformerLayer::ContextParallelAttention(
    Activations* act) const {
  if (context_.cp_comm_type == parallel::LayerContext::CpCommType::kAllToAll) {
    return context_parallel::UlyssesAttentionForward(
        context_.cp_group, act->cp_qkv, 0.0f, &act->cp_out, &act->cp_a2a);
  }
  return context_parallel::RingAttentionForward(
      context_.cp_group, act->cp_qkv, 0.0f, &act->cp_out, &act->cp_lse);
}

absl::Status TransformerLayer::Attention(int64_t micro_batch,
                                         Activations* act) const {
  const int64_t s = act->q.size(1);
  act->attn_out =
      Tensor::Empty(act->q.shape(), act->q.dtype(), act->q.device());
  act->lse = Tensor::Empty({micro_batch, local_heads_, s}, DType::kFloat32,
                           act->q.device());
  return ops::FlashAttentionForward(act->q, act->k, act->v,
                                    AttentionOptionsFor(micro_batch, s, *act),
                                    &act->attn_out, &act->lse);
}

ops::AttentionOptions TransformerLayer::AttentionOptionsFor(
    int64_t micro_batch, int64_t s, const Activations& act) const {
  ops::AttentionOptions options;
  options.causal = true;
  options.first_key = act.first_key;
  if (!training_ || config_.attention_dropout == 0.0) return options;
  // The model gives each (forward call, layer) a slot of 2 * s * b * h words
  // for the hidden dropouts; attention dropout uses the same slot number in
  // a stream of its own (another key), b * heads * s * s words a slot. Heads
  // are numbered globally, so tensor-parallel ranks draw the serial masks of
  // their own heads (Megatron's model-parallel RNG: different on every TP
  // rank inside the TP region, identical to the serial run).
  const uint64_t hidden_slot =
      2 * static_cast<uint64_t>(s * micro_batch * config_.hidden_size);
  const uint64_t slot = act.dropout_offset / hidden_slot;
  options.dropout_p = static_cast<float>(config_.attention_dropout);
  options.dropout_seed = config_.seed ^ 0xA7713D70F5EEDull;
  options.dropout_offset =
      slot *
      static_cast<uint64_t>(micro_batch * config_.num_attention_heads * s * s);
  options.head_offset = GroupRank(context_.tp_group) * local_heads_;
  options.total_heads = config_.num_attention_heads;
  return options;
}

absl::StatusOr<Tensor> TransformerLayer::Forward(const Tensor& x,
                                                 int64_t micro_batch,
                                                 uint64_t dropout_offset,
                                                 Activations* act) const {
  const int64_t b = micro_batch;
  const int64_t d = config_.head_dim();
  const uint64_t sp_shift = DropoutShift(x);
  const uint64_t stride = DropoutSiteStride(x);
  act->dropout_offset = dropout_offset;
  const bool cp = cp_size() > 1;

  MCC_ASSIGN_OR_RETURN(Tensor ln1, ln1_->Forward(x, &act->ln1));
  MCC_ASSIGN_OR_RETURN(Tensor qkv, qkv_->Forward(ln1, &act->qkv));
  const int64_t s = qkv.size(0) / b;
  Tensor ctx =
      Tensor::Empty({s * b, local_heads_ * d}, qkv.dtype(), qkv.device());
  if (cp) {
    MCC_RETURN_IF_ERROR(ContextParallelForward(qkv, b, s, act, &ctx));
  } else {
    MCC_RETURN_IF_ERROR(LocalAttentionForward(qkv, b, s, act, &ctx));
  }
  MCC_ASSIGN_OR_RETURN(Tensor attn, proj_->Forward(ctx, &act->proj));
  MCC_ASSIGN_OR_RETURN(attn, Dropout(attn, dropout_offset + sp_shift));
  Tensor h1 = Tensor::Empty(x.shape(), x.dtype(), x.device());
  MCC_RETURN_IF_ERROR(ops::Add(x, attn, &h1));
  return MlpForward(x, h1, b, dropout_offset + stride + sp_shift, act);
}

absl::Status TransformerLayer::LocalAttentionForward(const Tensor& qkv,
                                                     int64_t b, int64_t s,
                                                     Activations* act,
                                                     Tensor* ctx) const {
  const int64_t d = config_.head_dim();
  const QkvLayout layout{b, s, local_groups_, local_heads_ / local_groups_, d};
  act->q = Tensor::Empty({b, s, local_heads_, d}, qkv.dtype(), qkv.device());
  act->k = Tensor::Empty({b, s, local_groups_, d}, qkv.dtype(), qkv.device());
  act->v = Tensor::Empty({b, s, local_groups_, d}, qkv.dtype(), qkv.device());
  MCC_RETURN_IF_ERROR(SplitQkv(qkv, layout, &act->q, &act->k, &act->v));
  MCC_RETURN_IF_ERROR(QkNormForward(&act->q, &act->k, 0, act));
  if (config_.position_embedding == PositionEmbedding::kRope) {
    ops::RotaryOptions rope = config_.Rotary();
    MCC_RETURN_IF_ERROR(ops::RotaryForward(act->q, rope, &act->q));
    MCC_RETURN_IF_ERROR(ops::RotaryForward(act->k, rope, &act->k));
  }
  MCC_RETURN_IF_ERROR(Attention(b, act));
  MCC_RETURN_IF_ERROR(
      TransposeBatchSeq(act->attn_out, b, s, ctx, /*to_seq_major=*/true));
  if (config_.recompute_granularity == RecomputeGranularity::kSelective) {
    act->attn_out = Tensor();  // Rebuilt from q, k, v in the backward.
    act->lse = Tensor();
  }
  return absl::OkStatus();
}

absl::Status TransformerLayer::ContextParallelForward(const Tensor& qkv,
                                                      int64_t b, int64_t s,
                                                      Activations* act,
                                                      Tensor* ctx) const {
  const int64_t d = config_.head_dim();
  const int64_t l = s / 2;  // Rows [c * l * b, (c + 1) * l * b): chunk c.
  const QkvLayout layout{b, l, local_groups_, local_heads_ / local_groups_, d};
  context_parallel::QkvChunks& in = act->cp_qkv;
  in.first_key = act->first_key;
  for (int c = 0; c < 2; ++c) {
    MCC_ASSIGN_OR_RETURN(Tensor rows, qkv.Slice(c * l * b, (c + 1) * l * b));
    in.q[c] = Tensor::Empty({b, l, local_heads_, d}, qkv.dtype(), qkv.device());
    in.k[c] =
        Tensor::Empty({b, l, local_groups_, d}, qkv.dtype(), qkv.device());
    in.v[c] =
        Tensor::Empty({b, l, local_groups_, d}, qkv.dtype(), qkv.device());
    MCC_RETURN_IF_ERROR(SplitQkv(rows, layout, &in.q[c], &in.k[c], &in.v[c]));
    MCC_RETURN_IF_ERROR(QkNormForward(&in.q[c], &in.k[c], c, act));
    if (config_.position_embedding == PositionEmbedding::kRope) {
      ops::RotaryOptions rope = config_.Rotary();
      rope.position_offset = ChunkStart(c, l);
      MCC_RETURN_IF_ERROR(ops::RotaryForward(in.q[c], rope, &in.q[c]));
      MCC_RETURN_IF_ERROR(ops::RotaryForward(in.k[c], rope, &in.k[c]));
    }
  }
  MCC_RETURN_IF_ERROR(ContextParallelAttention(act));
  for (int c = 0; c < 2; ++c) {
    MCC_ASSIGN_OR_RETURN(Tensor rows, ctx->Slice(c * l * b, (c + 1) * l * b));
    MCC_RETURN_IF_ERROR(TransposeBatchSeq(act->cp_out[c], b, l, &rows,
                                          /*to_seq_major=*/true));
  }
  if (config_.recompute_granularity == RecomputeGranularity::kSelective) {
    act->cp_out = {};  // Rebuilt from the chunks' q, k, v in the backward.
    act->cp_lse = {};
    act->cp_a2a = {};
  }
  return absl::OkStatus();
}

int64_t TransformerLayer::ChunkStart(int local_chunk,
                                     int64_t chunk_length) const {
  return context_parallel::ChunkLayout::GlobalChunk(cp_size(), cp_rank(),
                                                    local_chunk) *
         chunk_length;
}

absl::StatusOr<Tensor> TransformerLayer::MlpForward(const Tensor& x,
                                                    const Tensor& h1,
                                                    int64_t micro_batch,
                                                    uint64_t dropout_offset,
                                                    Activations* act) const {
  MCC_ASSIGN_OR_RETURN(Tensor ln2, ln2_->Forward(h1, &act->ln2));
  if (moe_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(Tensor mlp,
                         moe_->Forward(ln2, micro_batch, &act->moe));
    MCC_ASSIGN_OR_RETURN(mlp, Dropout(mlp, dropout_offset));
    Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
    MCC_RETURN_IF_ERROR(ops::Add(h1, mlp, &out));
    return out;
  }
  MCC_ASSIGN_OR_RETURN(act->fc1_out, fc1_->Forward(ln2, &act->fc1));
  Tensor hidden;
  if (config_.activation == Activation::kSwiGLU) {
    hidden = Tensor::Empty({act->fc1_out.size(0), act->fc1_out.size(1) / 2},
                           x.dtype(), x.device());
    MCC_RETURN_IF_ERROR(ops::SwiGLU(act->fc1_out, &hidden));
  } else {
    hidden = Tensor::Empty(act->fc1_out.shape(), x.dtype(), x.device());
    if (fc1_->bias() != nullptr) {
      MCC_RETURN_IF_ERROR(
          ops::BiasGelu(act->fc1_out, fc1_->bias()->value, &hidden));
    } else {
      MCC_RETURN_IF_ERROR(ops::Gelu(act->fc1_out, &hidden));
    }
  }
  MCC_ASSIGN_OR_RETURN(Tensor mlp, fc2_->Forward(hidden, &act->fc2));
  MCC_ASSIGN_OR_RETURN(mlp, Dropout(mlp, dropout_offset));
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  MCC_RETURN_IF_ERROR(ops::Add(h1, mlp, &out));
  return out;
}

absl::StatusOr<Tensor> TransformerLayer::Backward(
    const Tensor& dy, int64_t micro_batch, Activations* act,
    float moe_loss_scale, parallel::DeferredWeightGrads* deferred) const {
  const int64_t b = micro_batch;
  const int64_t d = config_.head_dim();
  const uint64_t sp_shift = DropoutShift(dy);
  const uint64_t stride = DropoutSiteStride(dy);

  // MLP branch.
  MCC_ASSIGN_OR_RETURN(Tensor dmlp, DropoutBackward(dy, act->dropout_offset +
                                                            stride + sp_shift));
  Tensor dln2;
  // The dense MLP's gradients live to the end of the backward, as before
  // the MoE branch (cp_memory_test's peak bound assumes so).
  Tensor dhidden, dfc1;
  if (moe_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(dln2, moe_->Backward(dmlp, act->moe, moe_loss_scale));
  } else {
    MCC_ASSIGN_OR_RETURN(dhidden, fc2_->Backward(dmlp, act->fc2, deferred));
    dfc1 = Tensor::Empty(act->fc1_out.shape(), act->fc1_out.dtype(),
                         act->fc1_out.device());
    if (config_.activation == Activation::kSwiGLU) {
      MCC_RETURN_IF_ERROR(ops::SwiGLUBackward(dhidden, act->fc1_out, &dfc1));
    } else if (fc1_->bias() != nullptr) {
      MCC_RETURN_IF_ERROR(ops::BiasGeluBackward(dhidden, act->fc1_out,
                                                fc1_->bias()->value, &dfc1,
                                                &fc1_->bias()->main_grad));
    } else {
      MCC_RETURN_IF_ERROR(ops::GeluBackward(dhidden, act->fc1_out, &dfc1));
    }
    MCC_ASSIGN_OR_RETURN(dln2, fc1_->Backward(dfc1, act->fc1, deferred));
  }
  MCC_ASSIGN_OR_RETURN(Tensor dh1_norm, ln2_->Backward(dln2, act->ln2));
  Tensor dh1 = Tensor::Empty(dy.shape(), dy.dtype(), dy.device());
  MCC_RETURN_IF_ERROR(ops::Add(dy, dh1_norm, &dh1));

  // Attention branch.
  MCC_ASSIGN_OR_RETURN(Tensor dattn,
                       DropoutBackward(dh1, act->dropout_offset + sp_shift));
  MCC_ASSIGN_OR_RETURN(Tensor dctx,
                       proj_->Backward(dattn, act->proj, deferred));
  const int64_t s = dctx.size(0) / b;
  const QkvLayout layout{b, s, local_groups_, local_heads_ / local_groups_, d};
  Tensor dqkv =
      Tensor::Empty({s * b, layout.row()}, dctx.dtype(), dctx.device());
  if (cp_size() > 1) {
    MCC_RETURN_IF_ERROR(ContextParallelBackward(dctx, b, s, act, &dqkv));
  } else {
    MCC_RETURN_IF_ERROR(LocalAttentionBackward(dctx, b, s, act, &dqkv));
  }
  MCC_ASSIGN_OR_RETURN(Tensor dln1, qkv_->Backward(dqkv, act->qkv, deferred));
  MCC_ASSIGN_OR_RETURN(Tensor dx_norm, ln1_->Backward(dln1, act->ln1));
  Tensor dx = Tensor::Empty(dy.shape(), dy.dtype(), dy.device());
  MCC_RETURN_IF_ERROR(ops::Add(dh1, dx_norm, &dx));
  return dx;
}

absl::Status TransformerLayer::ContextParallelBackward(const Tensor& dctx,
                                                       int64_t b, int64_t s,
                                                       Activations* act,
                                                       Tensor* dqkv) const {
  const int64_t d = config_.head_dim();
  const int64_t l = s / 2;
  const QkvLayout layout{b, l, local_groups_, local_heads_ / local_groups_, d};
  if (!act->cp_out[0].defined()) {
    MCC_RETURN_IF_ERROR(ContextParallelAttention(act));
  }
  context_parallel::ChunkPair dout;
  for (int c = 0; c < 2; ++c) {
    MCC_ASSIGN_OR_RETURN(Tensor rows, dctx.Slice(c * l * b, (c + 1) * l * b));
    dout[c] =
        Tensor::Empty(act->cp_out[c].shape(), dctx.dtype(), dctx.device());
    MCC_RETURN_IF_ERROR(
        TransposeBatchSeq(rows, b, l, &dout[c], /*to_seq_major=*/false));
  }
  context_parallel::QkvChunks grads;
  if (context_.cp_comm_type == parallel::LayerContext::CpCommType::kAllToAll) {
    MCC_RETURN_IF_ERROR(context_parallel::UlyssesAttentionBackward(
        context_.cp_group, act->cp_a2a, dout, 0.0f, &grads));
  } else {
    MCC_RETURN_IF_ERROR(context_parallel::RingAttentionBackward(
        context_.cp_group, act->cp_qkv, act->cp_out, dout, act->cp_lse, 0.0f,
        &grads));
  }
  for (int c = 0; c < 2; ++c) {
    if (config_.position_embedding == PositionEmbedding::kRope) {
      ops::RotaryOptions rope = config_.Rotary();
      rope.position_offset = ChunkStart(c, l);
      MCC_RETURN_IF_ERROR(ops::RotaryBackward(grads.q[c], rope, &grads.q[c]));
      MCC_RETURN_IF_ERROR(ops::RotaryBackward(grads.k[c], rope, &grads.k[c]));
    }
    MCC_RETURN_IF_ERROR(QkNormBackward(&grads.q[c], &grads.k[c], c, *act));
    MCC_ASSIGN_OR_RETURN(Tensor rows, dqkv->Slice(c * l * b, (c + 1) * l * b));
    MCC_RETURN_IF_ERROR(
        MergeQkv(grads.q[c], grads.k[c], grads.v[c], layout, &rows));
  }
  return absl::OkStatus();
}

absl::Status TransformerLayer::LocalAttentionBackward(const Tensor& dctx,
                                                      int64_t b, int64_t s,
                                                      Activations* act,
                                                      Tensor* dqkv) const {
  const int64_t d = config_.head_dim();
  if (!act->attn_out.defined()) MCC_RETURN_IF_ERROR(Attention(b, act));
  Tensor dout =
      Tensor::Empty(act->attn_out.shape(), dctx.dtype(), dctx.device());
  MCC_RETURN_IF_ERROR(
      TransposeBatchSeq(dctx, b, s, &dout, /*to_seq_major=*/false));
  Tensor dq = Tensor::Empty(act->q.shape(), dctx.dtype(), dctx.device());
  Tensor dk = Tensor::Empty(act->k.shape(), dctx.dtype(), dctx.device());
  Tensor dv = Tensor::Empty(act->v.shape(), dctx.dtype(), dctx.device());
  MCC_RETURN_IF_ERROR(ops::FlashAttentionBackward(
      act->q, act->k, act->v, act->attn_out, dout, act->lse,
      AttentionOptionsFor(b, s, *act), &dq, &dk, &dv));
  if (config_.position_embedding == PositionEmbedding::kRope) {
    ops::RotaryOptions rope = config_.Rotary();
    MCC_RETURN_IF_ERROR(ops::RotaryBackward(dq, rope, &dq));
    MCC_RETURN_IF_ERROR(ops::RotaryBackward(dk, rope, &dk));
  }
  MCC_RETURN_IF_ERROR(QkNormBackward(&dq, &dk, 0, *act));
  const QkvLayout layout{b, s, local_groups_, local_heads_ / local_groups_, d};
  return MergeQkv(dq, dk, dv, layout, dqkv);
}

}  // namespace gpt
}  // namespace mcc
