#include "models/moe/moe_mlp.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ops/activation.h"
#include "core/ops/elementwise.h"
#include "core/ops/gemm.h"
#include "core/ops/grouped_gemm.h"
#include "core/ops/moe_permute.h"
#include "core/status_macros.h"

namespace mcc {
namespace moe {
namespace {

// A parameter of `shape` drawn from N(0, std) by its own generator (seed and
// index), stored in dtype, with an fp32 gradient. With count > 1 only piece
// `rank` of `count` along dimension 0 is kept (the whole tensor is drawn, so
// every split holds the serial layer's numbers).
absl::StatusOr<std::shared_ptr<Parameter>> MakeParameter(
    const std::string& name, const Shape& shape, DType dtype, float std,
    uint64_t seed, uint64_t index, Device device, int rank = 0, int count = 1) {
  std::mt19937_64 gen(seed * 1000003u + index);
  std::normal_distribution<float> dist(0.0f, std);
  std::vector<float> values(NumElements(shape));
  for (float& v : values) v = dist(gen);
  Shape local = shape;
  local[0] /= count;
  const int64_t piece = NumElements(local);
  std::vector<float> mine(values.begin() + rank * piece,
                          values.begin() + (rank + 1) * piece);
  auto p = std::make_shared<Parameter>();
  p->name = name;
  MCC_ASSIGN_OR_RETURN(p->value, Tensor::FromVector(mine, local, dtype));
  MCC_ASSIGN_OR_RETURN(p->value, p->value.To(device));
  p->main_grad = Tensor::Zeros(local, DType::kFloat32, device);
  p->global_shape = shape;
  if (count > 1) {
    p->partition_dim = 0;
    p->partition_rank = rank;
    p->partition_count = count;
  }
  return p;
}

// This ETP rank's slice of an expert weight along the ffn dimension: fc1
// [E, f1, h] keeps rows [q f_l, (q + 1) f_l) of each of its n_blocks blocks
// of f rows (SwiGLU's gate and up: 2), fc2 [E, h, f] keeps those columns.
absl::Status SliceFfn(Parameter* p, bool is_fc1, int64_t f, int64_t n_blocks,
                      int rank, int count) {
  const Shape in = p->value.shape();
  const int64_t fl = f / count;
  Shape out = in;
  if (is_fc1) {
    out[1] = n_blocks * fl;
  } else {
    out[2] = fl;
  }
  const std::vector<float> v = p->value.ToFloats();
  std::vector<float> kept;
  kept.reserve(NumElements(out));
  for (int64_t e = 0; e < in[0]; ++e) {
    for (int64_t r = 0; r < out[1]; ++r) {
      const int64_t src_row = is_fc1 ? (r / fl) * f + rank * fl + r % fl : r;
      const float* row = v.data() + (e * in[1] + src_row) * in[2];
      if (is_fc1) {
        kept.insert(kept.end(), row, row + in[2]);
      } else {
        kept.insert(kept.end(), row + rank * fl, row + (rank + 1) * fl);
      }
    }
  }
  const Device device = p->value.device();
  MCC_ASSIGN_OR_RETURN(p->value,
                       Tensor::FromVector(kept, out, p->value.dtype()));
  MCC_ASSIGN_OR_RETURN(p->value, p->value.To(device));
  p->main_grad = Tensor::Zeros(out, DType::kFloat32, device);
  // What checkpoints need to place the slice in the full tensor.
  p->expert_tensor_dim = is_fc1 ? 1 : 2;
  p->expert_tensor_rank = rank;
  p->expert_tensor_count = count;
  p->expert_tensor_blocks = static_cast<int>(n_blocks);
  return absl::OkStatus();
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("MoeMlp: ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MoeMlp>> MoeMlp::Create(
    const std::string& prefix, const MoeMlpConfig& config,
    const ExpertParallelism& ep) {
  if (config.hidden_size < 1 || config.ffn_hidden_size < 1) {
    return Invalid(absl::StrCat("hidden size ", config.hidden_size,
                                " and expert ffn hidden size ",
                                config.ffn_hidden_size, " must be positive"));
  }
  if (config.num_experts < 1) {
    return Invalid(absl::StrCat("num_experts ", config.num_experts,
                                " must be at least 1"));
  }
  if (config.router.topk < 1 || config.router.topk > config.num_experts) {
    return Invalid(absl::StrCat("topk ", config.router.topk, " must be in [1, ",
                                config.num_experts, "] (num_experts)"));
  }
  if (config.shared_expert_ffn_hidden_size < 0) {
    return Invalid("shared expert ffn hidden size must not be negative");
  }
  if (!(config.capacity_factor >= 0)) {
    return Invalid(absl::StrCat("capacity factor ", config.capacity_factor,
                                " must be positive, or 0 for dropless"));
  }
  if (config.dtype != DType::kFloat32 && config.dtype != DType::kBFloat16 &&
      config.dtype != DType::kFloat16) {
    return Invalid(absl::StrCat("dtype ", DTypeName(config.dtype),
                                " is not fp32, bf16 or fp16"));
  }
  std::unique_ptr<MoeMlp> m(new MoeMlp(config));
  int ep_rank = 0, ep_size = 1;
  if (ep.expert_model != nullptr && ep.expert_model->size() > 1) {
    MCC_ASSIGN_OR_RETURN(m->dispatcher_,
                         TokenDispatcher::Create(ep.dispatcher, ep.expert_model,
                                                 config.num_experts));
    ep_rank = ep.expert_model->rank();
    ep_size = ep.expert_model->size();
  }
  int etp_rank = 0, etp_size = 1;
  if (ep.expert_tensor != nullptr && ep.expert_tensor->size() > 1) {
    etp_rank = ep.expert_tensor->rank();
    etp_size = ep.expert_tensor->size();
    if (config.ffn_hidden_size % etp_size != 0) {
      return Invalid(absl::StrCat("expert ffn hidden size ",
                                  config.ffn_hidden_size,
                                  " does not divide over the ", etp_size,
                                  " expert-tensor-parallel ranks"));
    }
    MCC_ASSIGN_OR_RETURN(m->etp_dispatcher_,
                         TokenDispatcher::CreateReplicated(
                             ep.expert_tensor, config.num_experts / ep_size));
  }
  m->local_ffn_ = config.ffn_hidden_size / etp_size;
  const int64_t e = config.num_experts, h = config.hidden_size,
                f = config.ffn_hidden_size;
  const float std = config.init_std;
  MCC_ASSIGN_OR_RETURN(
      m->router_, MakeParameter(prefix + ".router.weight", {e, h}, config.dtype,
                                std, config.seed, 0, config.device));
  MCC_ASSIGN_OR_RETURN(
      m->fc1_, MakeParameter(prefix + ".experts.linear_fc1.weight",
                             {e, m->fc1_outputs(f), h}, config.dtype, std,
                             config.seed, 1, config.device, ep_rank, ep_size));
  MCC_ASSIGN_OR_RETURN(
      m->fc2_, MakeParameter(prefix + ".experts.linear_fc2.weight", {e, h, f},
                             config.dtype, std, config.seed, 2, config.device,
                             ep_rank, ep_size));
  if (etp_size > 1) {
    const bool swiglu = config.activation == ExpertActivation::kSwiGLU;
    MCC_RETURN_IF_ERROR(
        SliceFfn(m->fc1_.get(), true, f, swiglu ? 2 : 1, etp_rank, etp_size));
    MCC_RETURN_IF_ERROR(
        SliceFfn(m->fc2_.get(), false, f, 1, etp_rank, etp_size));
  }
  const int64_t fs = config.shared_expert_ffn_hidden_size;
  if (fs > 0) {
    MCC_ASSIGN_OR_RETURN(
        m->shared_fc1_,
        MakeParameter(prefix + ".shared_experts.linear_fc1.weight",
                      {m->fc1_outputs(fs), h}, config.dtype, std, config.seed,
                      3, config.device));
    MCC_ASSIGN_OR_RETURN(
        m->shared_fc2_,
        MakeParameter(prefix + ".shared_experts.linear_fc2.weight", {h, fs},
                      config.dtype, std, config.seed, 4, config.device));
    if (config.shared_expert_gate) {
      MCC_ASSIGN_OR_RETURN(
          m->shared_gate_,
          MakeParameter(prefix + ".shared_experts.gate_weight", {1, h},
                        config.dtype, std, config.seed, 5, config.device));
    }
  } else if (config.shared_expert_gate) {
    return Invalid("a shared expert gate needs a shared expert");
  }
  if (config.expert_bias) {
    m->expert_bias_ = Tensor::Zeros({e}, DType::kFloat32, config.device);
  }
  return m;
}

void MoeMlp::AppendParameters(ParameterList* out) const {
  for (const auto& p :
       {router_, fc1_, fc2_, shared_fc1_, shared_fc2_, shared_gate_}) {
    if (p != nullptr) out->push_back(p);
  }
}

absl::StatusOr<Tensor> MoeMlp::RouterWeight32() const {
  if (router_->value.dtype() == DType::kFloat32) return router_->value;
  return router_->value.To(DType::kFloat32);
}

absl::Status MoeMlp::Activate(const Tensor& in, Tensor* out) const {
  return config_.activation == ExpertActivation::kSwiGLU ? ops::SwiGLU(in, out)
                                                         : ops::Gelu(in, out);
}

absl::Status MoeMlp::ActivateBackward(const Tensor& dout, const Tensor& in,
                                      Tensor* din) const {
  return config_.activation == ExpertActivation::kSwiGLU
             ? ops::SwiGLUBackward(dout, in, din)
             : ops::GeluBackward(dout, in, din);
}

absl::StatusOr<Tensor> MoeMlp::Forward(const Tensor& x, int64_t sequences,
                                       Activations* act) const {
  const int64_t h = config_.hidden_size, e = config_.num_experts,
                k = config_.router.topk, f = local_ffn_;
  if (x.dim() != 2 || x.size(1) != h || x.dtype() != config_.dtype) {
    return Invalid(absl::StrCat("input ", x.Describe(), " must be ",
                                DTypeName(config_.dtype), "[tokens, ", h, "]"));
  }
  const int64_t t = x.size(0);
  if (sequences < 1 || t % sequences != 0) {
    return Invalid(absl::StrCat(t, " tokens are not ", sequences,
                                " sequences of one length"));
  }
  const Device dev = x.device();
  act->x = x;
  act->sequences = sequences;
  if (x.dtype() == DType::kFloat32) {
    act->x32 = x;
  } else {
    MCC_ASSIGN_OR_RETURN(act->x32, x.To(DType::kFloat32));
  }

  // Router, in fp32.
  act->logits = Tensor::Empty({t, e}, DType::kFloat32, dev);
  // The weight is stored in the model's dtype (one dtype for the
  // distributed optimizer, as Megatron's); the router computes in fp32.
  MCC_ASSIGN_OR_RETURN(const Tensor router32, RouterWeight32());
  MCC_RETURN_IF_ERROR(ops::Gemm(act->x32, false, router32, true, &act->logits));
  act->scores = Tensor::Empty({t, e}, DType::kFloat32, dev);
  act->indices = Tensor::Empty({t, k}, DType::kInt32, dev);
  act->weights = Tensor::Empty({t, k}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(ops::MoeRouterForward(
      act->logits, expert_bias_.defined() ? &expert_bias_ : nullptr,
      config_.router, &act->scores, &act->indices, &act->weights));
  if (config_.load_balancing != LoadBalancing::kNone &&
      config_.aux_loss_coeff > 0) {
    act->aux_loss = Tensor::Empty({1}, DType::kFloat32, dev);
    MCC_RETURN_IF_ERROR(SumSequenceCounts(balance_sequences(sequences), act));
    MCC_RETURN_IF_ERROR(ops::MoeLoadBalancingLoss(
        act->scores, act->indices, config_.router.score_function,
        balance_sequences(sequences), config_.aux_loss_coeff, &act->aux_loss,
        Totals(*act)));
  }
  if (config_.z_loss_coeff > 0) {
    // A mean over the tokens: each of the C ranks holding equal parts of
    // the sequences has its mean over C as its share.
    act->z_loss = Tensor::Empty({1}, DType::kFloat32, dev);
    MCC_RETURN_IF_ERROR(ops::MoeZLoss(
        act->logits, config_.z_loss_coeff / sequence_shards(), &act->z_loss));
  }

  // Slots over capacity go to the bucket after the last expert, with weight
  // zero (token_drop.h), so the sort puts them after every kept row.
  Tensor sort_indices = act->indices;
  act->dispatch_weights = act->weights;
  int64_t buckets = e;
  if (config_.capacity_factor > 0) {
    MCC_ASSIGN_OR_RETURN(Tensor host_indices, act->indices.To(Device::CPU()));
    MCC_ASSIGN_OR_RETURN(Tensor host_weights, act->weights.To(Device::CPU()));
    Tensor kept_indices = Tensor::Empty({t, k}, DType::kInt32);
    Tensor kept_weights = Tensor::Empty({t, k}, DType::kFloat32);
    // Token dropping is refused under SP (GPTConfig): only CP shares here.
    if (config_.context_parallel != nullptr &&
        config_.context_parallel->size() > 1) {
      MCC_RETURN_IF_ERROR(DropInContext(host_indices, host_weights, sequences,
                                        dev, &kept_indices, &kept_weights));
    } else {
      MCC_RETURN_IF_ERROR(
          DropOverCapacity(host_indices, host_weights, e,
                           ExpertCapacity(t, k, e, config_.capacity_factor),
                           config_.drop_policy, &kept_indices, &kept_weights)
              .status());
    }
    MCC_ASSIGN_OR_RETURN(sort_indices, kept_indices.To(dev));
    MCC_ASSIGN_OR_RETURN(act->dispatch_weights, kept_weights.To(dev));
    buckets = e + 1;
  }

  // Tokens grouped by expert; the counts come to the host for the grouped
  // GEMMs (one read per layer, as Megatron's all-to-all splits).
  act->row_to_slot = Tensor::Empty({t * k}, DType::kInt32, dev);
  act->slot_to_row = Tensor::Empty({t * k}, DType::kInt32, dev);
  Tensor counts = Tensor::Empty({buckets}, DType::kInt64, dev);
  MCC_RETURN_IF_ERROR(ops::MoeSortTokens(
      sort_indices, buckets, &act->row_to_slot, &act->slot_to_row, &counts));
  MCC_ASSIGN_OR_RETURN(Tensor host_counts, counts.To(Device::CPU()));
  const int64_t* c = host_counts.data<int64_t>();
  act->tokens_per_expert.assign(c, c + e);
  act->kept_rows = 0;
  for (int64_t n : act->tokens_per_expert) act->kept_rows += n;

  // Experts, on the kept rows; the dropped rows of expert_out stay zero (a
  // zero weight times a zero row adds exactly nothing).
  const DType dt = x.dtype();
  const int64_t kept = act->kept_rows;
  act->permuted = Tensor::Empty({t * k, h}, dt, dev);
  MCC_RETURN_IF_ERROR(ops::MoePermute(x, act->row_to_slot, &act->permuted));
  MCC_ASSIGN_OR_RETURN(Tensor kept_permuted, act->permuted.Slice(0, kept));
  act->expert_in = kept_permuted;
  act->local_counts = act->tokens_per_expert;
  if (dispatcher_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(act->plan, dispatcher_->Plan(act->tokens_per_expert));
    MCC_ASSIGN_OR_RETURN(act->expert_in,
                         dispatcher_->Dispatch(kept_permuted, act->plan));
    act->local_counts = act->plan.local_counts;
  }
  if (etp_dispatcher_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(act->etp_plan,
                         etp_dispatcher_->Plan(act->local_counts));
    MCC_ASSIGN_OR_RETURN(act->expert_in, etp_dispatcher_->Dispatch(
                                             act->expert_in, act->etp_plan));
    act->local_counts = act->etp_plan.local_counts;
  }
  const int64_t rows = act->expert_in.size(0);
  act->fc1_out = Tensor::Empty({rows, fc1_outputs(f)}, dt, dev);
  MCC_RETURN_IF_ERROR(ops::GroupedGemm(act->expert_in, fc1_->value, true,
                                       act->local_counts, &act->fc1_out));
  act->act_out = Tensor::Empty({rows, f}, dt, dev);
  MCC_RETURN_IF_ERROR(Activate(act->fc1_out, &act->act_out));
  act->expert_out = kept < t * k ? Tensor::Zeros({t * k, h}, dt, dev)
                                 : Tensor::Empty({t * k, h}, dt, dev);
  MCC_ASSIGN_OR_RETURN(Tensor kept_out, act->expert_out.Slice(0, kept));
  if (dispatcher_ == nullptr && etp_dispatcher_ == nullptr) {
    MCC_RETURN_IF_ERROR(ops::GroupedGemm(act->act_out, fc2_->value, true,
                                         act->local_counts, &kept_out));
  } else {
    Tensor local_out = Tensor::Empty({rows, h}, dt, dev);
    MCC_RETURN_IF_ERROR(ops::GroupedGemm(act->act_out, fc2_->value, true,
                                         act->local_counts, &local_out));
    // Partial sums over the ffn slices (ETP), then the rows' way back.
    MCC_ASSIGN_OR_RETURN(Tensor back, CombineRows(local_out, *act));
    MCC_RETURN_IF_ERROR(kept_out.CopyFrom(back));
  }
  Tensor y = Tensor::Empty({t, h}, dt, dev);
  MCC_RETURN_IF_ERROR(ops::MoeUnpermute(act->expert_out, act->slot_to_row,
                                        &act->dispatch_weights, &y));

  if (shared_fc1_ != nullptr) {
    const int64_t fs = config_.shared_expert_ffn_hidden_size;
    act->shared_fc1_out = Tensor::Empty({t, fc1_outputs(fs)}, dt, dev);
    MCC_RETURN_IF_ERROR(
        ops::Gemm(x, false, shared_fc1_->value, true, &act->shared_fc1_out));
    act->shared_act_out = Tensor::Empty({t, fs}, dt, dev);
    MCC_RETURN_IF_ERROR(Activate(act->shared_fc1_out, &act->shared_act_out));
    if (shared_gate_ == nullptr) {
      Tensor shared = Tensor::Empty({t, h}, DType::kFloat32, dev);
      MCC_RETURN_IF_ERROR(ops::Gemm(act->shared_act_out, false,
                                    shared_fc2_->value, true, &shared));
      MCC_RETURN_IF_ERROR(ops::Add(y, shared, &y));
      return y;
    }
    act->shared_out = Tensor::Empty({t, h}, dt, dev);
    MCC_RETURN_IF_ERROR(ops::Gemm(act->shared_act_out, false,
                                  shared_fc2_->value, true, &act->shared_out));
    // The gate is a one-expert router: its top-1 weight is sigmoid(x . w_g),
    // and the weighted sum over the (identity) slots is the gated output.
    MCC_ASSIGN_OR_RETURN(const Tensor gate32,
                         shared_gate_->value.To(DType::kFloat32));
    act->gate_logits = Tensor::Empty({t, 1}, DType::kFloat32, dev);
    MCC_RETURN_IF_ERROR(
        ops::Gemm(act->x32, false, gate32, true, &act->gate_logits));
    act->gate_scores = Tensor::Empty({t, 1}, DType::kFloat32, dev);
    act->gate_indices = Tensor::Empty({t, 1}, DType::kInt32, dev);
    Tensor gate_weights = Tensor::Empty({t, 1}, DType::kFloat32, dev);
    MCC_RETURN_IF_ERROR(ops::MoeRouterForward(
        act->gate_logits, nullptr, ops::SigmoidGateOptions(), &act->gate_scores,
        &act->gate_indices, &gate_weights));
    Tensor rows = Tensor::Empty({t}, DType::kInt32, dev);
    act->gate_slots = Tensor::Empty({t}, DType::kInt32, dev);
    Tensor count = Tensor::Empty({1}, DType::kInt64, dev);
    MCC_RETURN_IF_ERROR(ops::MoeSortTokens(act->gate_indices, 1, &rows,
                                           &act->gate_slots, &count));
    Tensor gated = Tensor::Empty({t, h}, dt, dev);
    MCC_RETURN_IF_ERROR(ops::MoeUnpermute(act->shared_out, act->gate_slots,
                                          &gate_weights, &gated));
    MCC_RETURN_IF_ERROR(ops::Add(y, gated, &y));
  }
  return y;
}

absl::StatusOr<Tensor> MoeMlp::Backward(const Tensor& dy,
                                        const Activations& act,
                                        float loss_grad_scale) const {
  const int64_t h = config_.hidden_size, e = config_.num_experts,
                k = config_.router.topk, f = local_ffn_;
  const int64_t t = act.x.size(0);
  if (dy.shape() != act.x.shape() || dy.dtype() != act.x.dtype()) {
    return Invalid(absl::StrCat("output gradient ", dy.Describe(),
                                " does not match the input ",
                                act.x.Describe()));
  }
  const Device dev = dy.device();
  const DType dt = dy.dtype();
  // Input-gradient contributions that are not the permuted path, summed in
  // fp32 and rounded once at the end.
  Tensor dx32 = Tensor::Empty({t, h}, DType::kFloat32, dev);

  // Unpermute: dexpert_out and the combine weights' gradient (zero for
  // dropped slots: their expert_out rows are zero).
  const int64_t kept = act.kept_rows;
  Tensor dexpert_out = Tensor::Empty({t * k, h}, dt, dev);
  Tensor dweights = Tensor::Empty({t, k}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(ops::MoeUnpermuteBackward(
      dy, act.expert_out, act.slot_to_row, &act.dispatch_weights, &dexpert_out,
      &dweights));
  MCC_ASSIGN_OR_RETURN(Tensor kept_dout, dexpert_out.Slice(0, kept));
  // The gradients travel as the rows did: Dispatch and Combine are each
  // other's transpose.
  MCC_ASSIGN_OR_RETURN(Tensor local_dout, DispatchRows(kept_dout, act));
  const int64_t rows = act.expert_in.size(0);
  // Experts: fc2, activation, fc1.
  MCC_RETURN_IF_ERROR(ops::GroupedGemmWeightGrad(
      act.act_out, local_dout, true, act.local_counts, &fc2_->main_grad));
  Tensor dact = Tensor::Empty({rows, f}, dt, dev);
  MCC_RETURN_IF_ERROR(ops::GroupedGemm(local_dout, fc2_->value, false,
                                       act.local_counts, &dact));
  Tensor dfc1 = Tensor::Empty(act.fc1_out.shape(), dt, dev);
  MCC_RETURN_IF_ERROR(ActivateBackward(dact, act.fc1_out, &dfc1));
  MCC_RETURN_IF_ERROR(ops::GroupedGemmWeightGrad(
      act.expert_in, dfc1, true, act.local_counts, &fc1_->main_grad));
  // Dropped rows take no gradient back to their tokens.
  Tensor dpermuted = kept < t * k ? Tensor::Zeros({t * k, h}, dt, dev)
                                  : Tensor::Empty({t * k, h}, dt, dev);
  MCC_ASSIGN_OR_RETURN(Tensor kept_dpermuted, dpermuted.Slice(0, kept));
  if (dispatcher_ == nullptr && etp_dispatcher_ == nullptr) {
    MCC_RETURN_IF_ERROR(ops::GroupedGemm(dfc1, fc1_->value, false,
                                         act.local_counts, &kept_dpermuted));
  } else {
    Tensor dexpert_in = Tensor::Empty({rows, h}, dt, dev);
    MCC_RETURN_IF_ERROR(ops::GroupedGemm(dfc1, fc1_->value, false,
                                         act.local_counts, &dexpert_in));
    MCC_ASSIGN_OR_RETURN(Tensor back, CombineRows(dexpert_in, act));
    MCC_RETURN_IF_ERROR(kept_dpermuted.CopyFrom(back));
  }
  Tensor dx_experts = Tensor::Empty({t, h}, dt, dev);
  MCC_RETURN_IF_ERROR(
      ops::MoePermuteBackward(dpermuted, act.slot_to_row, &dx_experts));

  // Router: the combine weights, the balancing loss and the z-loss.
  Tensor dlogits = Tensor::Empty({t, e}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(ops::MoeRouterBackward(act.scores, act.indices, dweights,
                                             config_.router, &dlogits));
  if (act.aux_loss.defined()) {
    MCC_RETURN_IF_ERROR(ops::MoeLoadBalancingLossBackward(
        act.scores, act.indices, config_.router.score_function,
        balance_sequences(act.sequences), config_.aux_loss_coeff,
        loss_grad_scale, &dlogits, Totals(act)));
  }
  if (act.z_loss.defined()) {
    MCC_RETURN_IF_ERROR(ops::MoeZLossBackward(
        act.logits, config_.z_loss_coeff / sequence_shards(), loss_grad_scale,
        &dlogits));
  }
  MCC_RETURN_IF_ERROR(ops::Gemm(dlogits, true, act.x32, false,
                                &router_->main_grad, 1.0f, 1.0f));
  MCC_ASSIGN_OR_RETURN(const Tensor router32, RouterWeight32());
  MCC_RETURN_IF_ERROR(ops::Gemm(dlogits, false, router32, false, &dx32));

  // Shared expert, through its gate first.
  if (shared_fc1_ != nullptr) {
    Tensor dshared = dy;
    if (shared_gate_ != nullptr) {
      dshared = Tensor::Empty({t, h}, dt, dev);
      Tensor dgate = Tensor::Empty({t, 1}, DType::kFloat32, dev);
      // The combine weight is the gate's score itself (top-1 of one,
      // not renormalised).
      MCC_RETURN_IF_ERROR(
          ops::MoeUnpermuteBackward(dy, act.shared_out, act.gate_slots,
                                    &act.gate_scores, &dshared, &dgate));
      Tensor dgate_logits = Tensor::Empty({t, 1}, DType::kFloat32, dev);
      MCC_RETURN_IF_ERROR(
          ops::MoeRouterBackward(act.gate_scores, act.gate_indices, dgate,
                                 ops::SigmoidGateOptions(), &dgate_logits));
      MCC_RETURN_IF_ERROR(ops::Gemm(dgate_logits, true, act.x32, false,
                                    &shared_gate_->main_grad, 1.0f, 1.0f));
      MCC_ASSIGN_OR_RETURN(const Tensor gate32,
                           shared_gate_->value.To(DType::kFloat32));
      MCC_RETURN_IF_ERROR(
          ops::Gemm(dgate_logits, false, gate32, false, &dx32, 1.0f, 1.0f));
    }
    MCC_RETURN_IF_ERROR(ops::Gemm(dshared, true, act.shared_act_out, false,
                                  &shared_fc2_->main_grad, 1.0f, 1.0f));
    Tensor dsact = Tensor::Empty(act.shared_act_out.shape(), dt, dev);
    MCC_RETURN_IF_ERROR(
        ops::Gemm(dshared, false, shared_fc2_->value, false, &dsact));
    Tensor dsfc1 = Tensor::Empty(act.shared_fc1_out.shape(), dt, dev);
    MCC_RETURN_IF_ERROR(ActivateBackward(dsact, act.shared_fc1_out, &dsfc1));
    MCC_RETURN_IF_ERROR(ops::Gemm(dsfc1, true, act.x, false,
                                  &shared_fc1_->main_grad, 1.0f, 1.0f));
    MCC_RETURN_IF_ERROR(
        ops::Gemm(dsfc1, false, shared_fc1_->value, false, &dx32, 1.0f, 1.0f));
  }
  Tensor dx = Tensor::Empty({t, h}, dt, dev);
  MCC_RETURN_IF_ERROR(ops::Add(dx_experts, dx32, &dx));
  return dx;
}

int MoeMlp::sequence_shards() const {
  int n = 1;
  for (comm::ProcessGroup* g :
       {config_.context_parallel, config_.sequence_parallel}) {
    if (g != nullptr) n *= g->size();
  }
  return n;
}

absl::Status MoeMlp::SumSequenceCounts(int64_t sequences,
                                       Activations* act) const {
  act->sequence_counts = Tensor();
  if (sequence_shards() == 1) return absl::OkStatus();
  // Counted on the host (the forward reads the expert counts there too),
  // then summed over the ranks holding the rest of each sequence (CP, then
  // TP under SP: the sum over both is the sum over their product).
  const int64_t e = config_.num_experts, k = config_.router.topk;
  MCC_ASSIGN_OR_RETURN(Tensor host, act->indices.To(Device::CPU()));
  const int32_t* idx = host.data<int32_t>();
  std::vector<int64_t> counts(sequences * e, 0);
  for (int64_t r = 0; r < host.size(0); ++r) {
    for (int64_t i = 0; i < k; ++i) {
      ++counts[(r % sequences) * e + idx[r * k + i]];
    }
  }
  MCC_ASSIGN_OR_RETURN(Tensor summed, Tensor::FromInts(counts, {sequences, e}));
  MCC_ASSIGN_OR_RETURN(summed, summed.To(act->indices.device()));
  for (comm::ProcessGroup* g :
       {config_.context_parallel, config_.sequence_parallel}) {
    if (g == nullptr || g->size() == 1) continue;
    MCC_RETURN_IF_ERROR(g->AllReduceSync(&summed, comm::ReduceOp::kSum));
  }
  act->sequence_counts = summed;
  return absl::OkStatus();
}

absl::Status MoeMlp::DropInContext(const Tensor& indices, const Tensor& weights,
                                   int64_t sequences, const Device& device,
                                   Tensor* kept_indices,
                                   Tensor* kept_weights) const {
  // The CP ranks' slots, gathered in one collective: indices as floats
  // (exact below 2^24) beside the weights, [t, 2k] per rank.
  const int64_t t = indices.size(0), k = indices.size(1);
  const int c = config_.context_parallel->size();
  Tensor packed = Tensor::Empty({t, 2 * k}, DType::kFloat32);
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      packed.data<float>()[r * 2 * k + i] =
          static_cast<float>(indices.data<int32_t>()[r * k + i]);
      packed.data<float>()[r * 2 * k + k + i] =
          weights.data<float>()[r * k + i];
    }
  }
  MCC_ASSIGN_OR_RETURN(Tensor mine, packed.To(device));
  Tensor all = Tensor::Empty({c * t, 2 * k}, DType::kFloat32, device);
  MCC_RETURN_IF_ERROR(config_.context_parallel->AllGatherSync(mine, &all));
  MCC_ASSIGN_OR_RETURN(Tensor host, all.To(Device::CPU()));
  Tensor all_indices = Tensor::Empty({c * t, k}, DType::kInt32);
  Tensor all_weights = Tensor::Empty({c * t, k}, DType::kFloat32);
  for (int64_t r = 0; r < c * t; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      all_indices.data<int32_t>()[r * k + i] =
          static_cast<int32_t>(host.data<float>()[r * 2 * k + i]);
      all_weights.data<float>()[r * k + i] =
          host.data<float>()[r * 2 * k + k + i];
    }
  }
  return DropOverCapacityInContext(all_indices, all_weights, sequences, c,
                                   config_.context_parallel->rank(),
                                   config_.num_experts, config_.capacity_factor,
                                   config_.drop_policy, kept_indices,
                                   kept_weights)
      .status();
}

ops::MoeSequenceTotals MoeMlp::Totals(const Activations& act) const {
  ops::MoeSequenceTotals totals;
  if (!act.sequence_counts.defined()) return totals;
  totals.counts = &act.sequence_counts;
  // Every CP and SP rank holds the same number of each sequence's tokens.
  totals.length =
      act.x.size(0) / act.sequence_counts.size(0) * sequence_shards();
  return totals;
}

absl::StatusOr<Tensor> MoeMlp::DispatchRows(const Tensor& rows,
                                            const Activations& act) const {
  Tensor out = rows;
  if (dispatcher_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(out, dispatcher_->Dispatch(out, act.plan));
  }
  if (etp_dispatcher_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(out, etp_dispatcher_->Dispatch(out, act.etp_plan));
  }
  return out;
}

absl::StatusOr<Tensor> MoeMlp::CombineRows(const Tensor& rows,
                                           const Activations& act) const {
  Tensor out = rows;
  if (etp_dispatcher_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(out, etp_dispatcher_->Combine(out, act.etp_plan));
  }
  if (dispatcher_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(out, dispatcher_->Combine(out, act.plan));
  }
  return out;
}

absl::Status MoeMlp::ReduceGradients(comm::ProcessGroup* data,
                                     comm::ProcessGroup* expert_data) const {
  const float scale = data != nullptr ? 1.0f / data->size() : 1.0f;
  auto reduce = [&](Parameter* p, comm::ProcessGroup* group) -> absl::Status {
    if (p == nullptr) return absl::OkStatus();
    if (group != nullptr && group->size() > 1) {
      MCC_RETURN_IF_ERROR(
          group->AllReduceSync(&p->main_grad, comm::ReduceOp::kSum));
    }
    if (scale != 1.0f) {
      MCC_RETURN_IF_ERROR(ops::Scale(p->main_grad, scale, &p->main_grad));
    }
    return absl::OkStatus();
  };
  MCC_RETURN_IF_ERROR(reduce(router_.get(), data));
  MCC_RETURN_IF_ERROR(reduce(shared_fc1_.get(), data));
  MCC_RETURN_IF_ERROR(reduce(shared_fc2_.get(), data));
  MCC_RETURN_IF_ERROR(reduce(shared_gate_.get(), data));
  MCC_RETURN_IF_ERROR(reduce(fc1_.get(), expert_data));
  return reduce(fc2_.get(), expert_data);
}

absl::Status MoeMlp::UpdateExpertBias(
    const std::vector<int64_t>& tokens_per_expert, float rate) {
  if (!expert_bias_.defined()) {
    return absl::FailedPreconditionError(
        "MoeMlp: UpdateExpertBias without expert_bias in the config");
  }
  MCC_ASSIGN_OR_RETURN(
      Tensor counts,
      Tensor::FromInts(tokens_per_expert,
                       {static_cast<int64_t>(tokens_per_expert.size())}));
  MCC_ASSIGN_OR_RETURN(counts, counts.To(expert_bias_.device()));
  return ops::MoeUpdateExpertBias(counts, rate, &expert_bias_);
}

}  // namespace moe
}  // namespace mcc
