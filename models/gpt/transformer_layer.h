#ifndef MODELS_GPT_TRANSFORMER_LAYER_H_
#define MODELS_GPT_TRANSFORMER_LAYER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/ops/attention.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "models/gpt/gpt_config.h"
#include "models/moe/moe_mlp.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/ulysses_attention.h"
#include "parallel/linear.h"

namespace mcc {
namespace gpt {

// A normalisation layer (LayerNorm or RMSNorm) over the last dimension, its
// weights replicated over tensor-parallel ranks.
class Norm {
 public:
  struct Activations {
    Tensor input, mean, rstd;
  };
  static absl::StatusOr<std::unique_ptr<Norm>> Create(
      const std::string& name, const GPTConfig& config,
      const parallel::LayerContext& context);
  // QK-norm's (--qk-layernorm): over each head's head_dim elements, its
  // weights shared by every head; each TP rank normalises its own heads, so
  // the weight gradients are summed over TP (as Megatron's q_layernorm and
  // k_layernorm).
  static absl::StatusOr<std::unique_ptr<Norm>> CreatePerHead(
      const std::string& name, const GPTConfig& config,
      const parallel::LayerContext& context);
  absl::StatusOr<Tensor> Forward(const Tensor& x, Activations* act) const;
  // Returns dx; accumulates the weight (and bias) gradients.
  absl::StatusOr<Tensor> Backward(const Tensor& dy,
                                  const Activations& act) const;
  void AppendParameters(ParameterList* out) const;

 private:
  Normalization kind_ = Normalization::kLayerNorm;
  float eps_ = 1e-5f;
  std::shared_ptr<Parameter> weight_, bias_;
};

// One pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(.)).
// Hidden states are [s * b, hidden] in sequence-major order ([s, b, h]
// flattened), or this rank's [s / TP * b, hidden] under sequence
// parallelism; under context parallelism s is this rank's two chunks of
// the sequence (chunk i, then 2C - 1 - i), and rotary positions and the
// causal mask follow their global positions. Forward records what backward
// needs in an Activations owned by the caller, so several micro-batches can be
// in flight and a caller can drop a record and rebuild it (full recomputation).
class TransformerLayer {
 public:
  struct Activations {
    Norm::Activations ln1, ln2;
    parallel::ColumnParallelLinear::Activations qkv, fc1;
    parallel::RowParallelLinear::Activations proj, fc2;
    Tensor q, k, v;  // [b, s, heads / TP, d], after rotary
    // --qk-layernorm: q and k before their norm (and its rstd); per
    // context-parallel chunk under CP.
    Norm::Activations q_norm[2], k_norm[2];
    Tensor attn_out, lse;  // dropped and recomputed under selective
    Tensor fc1_out;        // before the bias and activation
    uint64_t dropout_offset = 0;
    // Under context parallelism q, k, v, attn_out and lse above stay
    // undefined: attention works on this rank's two sequence chunks.
    context_parallel::QkvChunks cp_qkv;
    context_parallel::ChunkPair cp_out, cp_lse;  // Dropped under selective.
    context_parallel::UlyssesRecord cp_a2a;      // --cp-comm-type a2a.
    moe::MoeMlp::Activations moe;  // An MoE layer's MLP (no fc1 / fc2).
    // Packed documents / sliding window: the first key each query of the
    // whole sequence sees, int32 [b, S] on the host by global position
    // (document_mask.h); undefined: causal only. Set by the model before
    // Forward and kept for Backward; not offloaded.
    Tensor first_key;

    // Every tensor above, in a fixed order, for activation offloading
    // (core/activation_offload.h); a tensor field added above belongs here
    // too, or it stays on the device.
    std::vector<Tensor*> Tensors();
  };

  static absl::StatusOr<std::unique_ptr<TransformerLayer>> Create(
      int layer_number, const GPTConfig& config,
      const parallel::LayerContext& context);

  // dropout_offset: where this call's dropout masks start in the generator's
  // stream (the same number on every TP rank).
  absl::StatusOr<Tensor> Forward(const Tensor& x, int64_t micro_batch,
                                 uint64_t dropout_offset,
                                 Activations* act) const;
  // moe_loss_scale: the gradient of the training loss with respect to this
  // micro-batch's balancing and z-losses (its loss scale over the
  // micro-batch count, as Megatron's MoEAuxLossAutoScaler); unused by a
  // dense layer. With `deferred`, the linear layers' weight and bias
  // gradients are left to it (the input-gradient step of a split
  // backward); an MoE layer's experts and router take theirs in B.
  absl::StatusOr<Tensor> Backward(
      const Tensor& dy, int64_t micro_batch, Activations* act,
      float moe_loss_scale = 1.0f,
      parallel::DeferredWeightGrads* deferred = nullptr) const;

  void AppendParameters(ParameterList* out) const;
  // The mixture of experts in place of the MLP (null: a dense layer, whose
  // fc1 and fc2 are then set; an MoE layer has neither).
  moe::MoeMlp* moe() const { return moe_.get(); }
  // The linear layers, for weight-only int8 inference
  // (models/gpt/int8_quantization.h).
  parallel::ColumnParallelLinear* qkv() { return qkv_.get(); }
  parallel::RowParallelLinear* proj() { return proj_.get(); }
  parallel::ColumnParallelLinear* fc1() { return fc1_.get(); }
  parallel::RowParallelLinear* fc2() { return fc2_.get(); }
  // Their int8 weights (null until converted), for the inference engine.
  const parallel::Int8Weight* qkv_int8() const { return qkv_->int8_weight(); }
  const parallel::Int8Weight* proj_int8() const { return proj_->int8_weight(); }
  const parallel::Int8Weight* fc1_int8() const {
    return fc1_ == nullptr ? nullptr : fc1_->int8_weight();
  }
  const parallel::Int8Weight* fc2_int8() const {
    return fc2_ == nullptr ? nullptr : fc2_->int8_weight();
  }
  // Their FP8 weights (null until converted; models/gpt/fp8_quantization.h).
  const parallel::Fp8Weight* qkv_fp8() const { return qkv_->fp8_weight(); }
  const parallel::Fp8Weight* proj_fp8() const { return proj_->fp8_weight(); }
  const parallel::Fp8Weight* fc1_fp8() const {
    return fc1_ == nullptr ? nullptr : fc1_->fp8_weight();
  }
  const parallel::Fp8Weight* fc2_fp8() const {
    return fc2_ == nullptr ? nullptr : fc2_->fp8_weight();
  }
  // Dropout applies only while training (the default).
  void set_training(bool training) { training_ = training; }

 private:
  // The attention half of Forward between the QKV projection's output
  // [s * b, ...] and ctx [s * b, heads / TP * d] (the output projection's
  // input): on the whole sequence here, or on this rank's two chunks across
  // the context-parallel group.
  absl::Status LocalAttentionForward(const Tensor& qkv, int64_t b, int64_t s,
                                     Activations* act, Tensor* ctx) const;
  absl::Status ContextParallelForward(const Tensor& qkv, int64_t b, int64_t s,
                                      Activations* act, Tensor* ctx) const;
  // dctx -> dqkv, the backward of the above.
  absl::Status LocalAttentionBackward(const Tensor& dctx, int64_t b, int64_t s,
                                      Activations* act, Tensor* dqkv) const;
  absl::Status ContextParallelBackward(const Tensor& dctx, int64_t b, int64_t s,
                                       Activations* act, Tensor* dqkv) const;
  // The MLP half: returns h1 + mlp(norm(h1)); x is the layer input.
  absl::StatusOr<Tensor> MlpForward(const Tensor& x, const Tensor& h1,
                                    int64_t micro_batch,
                                    uint64_t dropout_offset,
                                    Activations* act) const;
  static absl::StatusOr<std::unique_ptr<moe::MoeMlp>> CreateMoe(
      const std::string& prefix, int layer_number, const GPTConfig& config,
      const parallel::LayerContext& context);
  // The global position of the first token of local chunk 0 or 1.
  int64_t ChunkStart(int local_chunk, int64_t chunk_length) const;
  absl::Status Attention(int64_t micro_batch, Activations* act) const;
  // Attention of this rank's two chunks across the context-parallel group.
  absl::Status ContextParallelAttention(Activations* act) const;
  int cp_size() const;
  int cp_rank() const;
  // Where this rank's hidden-dropout masks start within a site of the
  // serial stream, and how far apart the two sites are (tokens x hidden of
  // the whole sequence), for x of this rank's [tokens, hidden].
  uint64_t DropoutShift(const Tensor& x) const;
  uint64_t DropoutSiteStride(const Tensor& x) const;
  // Causal attention, with attention dropout while training.
  ops::AttentionOptions AttentionOptionsFor(int64_t micro_batch, int64_t s,
                                            const Activations& act) const;
  absl::StatusOr<Tensor> Dropout(const Tensor& x, uint64_t offset) const;
  absl::StatusOr<Tensor> DropoutBackward(const Tensor& dy,
                                         uint64_t offset) const;

  GPTConfig config_;
  parallel::LayerContext context_;
  int64_t local_heads_ = 0;
  int64_t local_groups_ = 0;
  // q and k [b, s, heads, d] through the QK-norm in place (forward), or
  // their gradients back through it; `chunk` picks the activation record.
  absl::Status QkNormForward(Tensor* q, Tensor* k, int chunk,
                             Activations* act) const;
  absl::Status QkNormBackward(Tensor* dq, Tensor* dk, int chunk,
                              const Activations& act) const;

  std::unique_ptr<Norm> ln1_, ln2_;
  std::unique_ptr<Norm> q_norm_, k_norm_;  // --qk-layernorm only
  std::unique_ptr<parallel::ColumnParallelLinear> qkv_, fc1_;
  std::unique_ptr<parallel::RowParallelLinear> proj_, fc2_;
  std::unique_ptr<moe::MoeMlp> moe_;
  bool training_ = true;
};

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_TRANSFORMER_LAYER_H_
