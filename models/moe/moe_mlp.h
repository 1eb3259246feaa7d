#ifndef MODELS_MOE_MOE_MLP_H_
#define MODELS_MOE_MOE_MLP_H_

// A mixture-of-experts MLP (issue 41): the router, the token
// permutation, the experts as grouped GEMMs and the weighted unpermutation,
// plus an optional shared expert every token goes through (Qwen-MoE's,
// DeepSeek's; without a gate as Megatron's default, or with Qwen2-MoE's
// sigmoid gate, Megatron's --moe-shared-expert-gate):
//
//   logits = x W_r^T (fp32)           router: scores, top-k, combine weights
//   y_t = sum_i w_ti E_{e_ti}(x_t) + g_t S(x_t),  E(x) = fc2(act(fc1(x)))
//   g_t = sigmoid(x_t . w_g) (fp32) with the gate, else 1
//
// with act SwiGLU (fc1 has 2f outputs: [gate, up]) or GELU, no biases
// (--disable-bias-linear, as MoE models train). Hidden states are
// [tokens, hidden], tokens sequence-major ([s, b] flattened) as elsewhere in
// the models; fp32, bf16 or fp16 (16-bit weights and activations, fp32 main
// gradients and router). Forward records what Backward needs in an
// Activations owned by the caller (the models' convention); Backward
// accumulates the parameters' main_grad (fp32) and returns dx.
//
// Deterministic: the kernels under it (core/ops/moe_*.h, grouped_gemm.h)
// give the same result on every run for a given thread count; the router,
// permutation and unpermutation also across thread counts.
//
// A capacity factor drops the slots over each expert's capacity
// (token_drop.h, Megatron's semantics), on each rank's own tokens; under
// context parallelism on the whole micro-batch the CP ranks share, as the
// serial run drops (DropOverCapacityInContext).
//
// Expert parallelism: given an expert-model-parallel group of EP ranks, the
// layer holds only its E / EP experts (the serial layer's weights for them:
// every layout starts from the same model); router and shared expert are
// whole on every rank. Each rank routes and permutes its own tokens, a
// TokenDispatcher (token_dispatcher.h) moves the rows to their experts' ranks
// and back, and the experts run on the rows they receive; the rest is the
// serial layer's code. ReduceGradients then reduces the experts' gradients
// over the expert-data-parallel group only.
//
// With an expert-tensor-parallel group of ETP ranks each expert's ffn
// dimension is split over it (Megatron's ETP: fc1 column-, fc2
// row-parallel), ffn_hidden_size divisible by ETP.
//
// Context and sequence parallelism: given the CP group, or the TP group
// when the input is sequence-parallel (each rank holding part of every
// sequence), the layer stays token-wise; only the balancing statistics are
// the whole sequences': the routed counts are summed over the groups, and
// aux_loss and z_loss become this rank's share of the whole micro-batch's
// losses (the shares add up over the groups), with the whole losses'
// gradients for this rank's tokens. The router and shared expert then see
// only this rank's tokens: their gradients are partial sums (the caller
// marks them sequence_parallel, summed over TP).
//
// Not here yet (issue 41): CUDA kernels, logging of the balance,
// checkpoint names (the expert weights' Parameter records only the EP
// split).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/ops/moe_router.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "models/moe/token_dispatcher.h"
#include "models/moe/token_drop.h"

namespace mcc {
namespace moe {

enum class ExpertActivation { kSwiGLU, kGelu };
enum class LoadBalancing { kNone, kAuxLoss, kSeqAuxLoss };

struct MoeMlpConfig {
  int64_t hidden_size = 0;
  int64_t num_experts = 0;
  int64_t ffn_hidden_size = 0;  // Per expert (--moe-ffn-hidden-size).
  int64_t shared_expert_ffn_hidden_size = 0;  // 0: no shared expert.
  bool shared_expert_gate = false;  // The shared expert's sigmoid gate.
  ops::MoeRouterOptions router;     // topk, score function, ...
  bool expert_bias = false;         // --moe-router-enable-expert-bias.
  LoadBalancing load_balancing = LoadBalancing::kAuxLoss;
  float aux_loss_coeff = 0.0f;
  float z_loss_coeff = 0.0f;
  ExpertActivation activation = ExpertActivation::kSwiGLU;
  // --moe-expert-capacity-factor: > 0 drops the slots over each expert's
  // capacity (token_drop.h) by drop_policy; 0: dropless.
  double capacity_factor = 0.0;
  TokenDropPolicy drop_policy = TokenDropPolicy::kProbs;
  // Weights and activations: fp32, bf16 or fp16 (with loss scaling, the
  // balancing losses' gradients scaled by Backward's loss_grad_scale).
  DType dtype = DType::kFloat32;
  // Where the parameters, their gradients and the expert bias live (drawn
  // on the host, then copied).
  Device device = Device::CPU();
  float init_std = 0.02f;
  uint64_t seed = 1234;
  // The context-parallel group (null or size 1: every token of each
  // sequence is here).
  comm::ProcessGroup* context_parallel = nullptr;
  // The tensor-parallel group when the input is sequence-parallel (each TP
  // rank holding 1/TP of every sequence's tokens, Megatron's SP layout);
  // null or size 1 otherwise (every TP rank routes the same tokens).
  comm::ProcessGroup* sequence_parallel = nullptr;
};

// Where the experts live. Null group or size 1: all experts on this rank.
struct ExpertParallelism {
  comm::ProcessGroup* expert_model = nullptr;  // The EP group.
  TokenDispatcherType dispatcher = TokenDispatcherType::kAllToAll;
  // The ETP group: each expert's fc1 split by output (SwiGLU: gate and up
  // alike) and fc2 by input over it; its ranks' rows are gathered before
  // the experts and the partial outputs reduce-scattered after. Null or
  // size 1: whole experts.
  comm::ProcessGroup* expert_tensor = nullptr;
};

class MoeMlp {
 public:
  struct Activations {
    Tensor x, x32;  // Input, and as fp32 for the router.
    Tensor logits, scores, indices, weights;
    // The weights the experts' outputs are combined with: `weights`, or
    // with a capacity factor the same with dropped slots at zero.
    Tensor dispatch_weights;
    Tensor row_to_slot, slot_to_row;  // MoeSortTokens.
    // Kept slots per expert, on the host; kept_rows is their sum, the
    // permuted rows the experts compute (the dropped ones sort after them).
    std::vector<int64_t> tokens_per_expert;
    int64_t kept_rows = 0;
    // What the local experts compute on: the kept permuted rows (serial) or
    // the dispatched ones, grouped by local expert with local_counts rows.
    Tensor expert_in;
    std::vector<int64_t> local_counts;
    DispatchPlan plan;      // Expert parallelism only.
    DispatchPlan etp_plan;  // Expert tensor parallelism only.
    Tensor permuted, fc1_out, act_out, expert_out;
    Tensor shared_fc1_out, shared_act_out;
    // The gate: the shared expert's output [t, h], the gate's logits,
    // sigmoid and (identity) slot order for the weighted sum, fp32 [t, 1].
    Tensor shared_out, gate_logits, gate_scores, gate_indices, gate_slots;
    int64_t sequences = 1;
    // Context or sequence parallelism with the balancing loss: int64
    // [sequences of the loss, E], the whole sequences' routed slots (summed
    // over the groups).
    Tensor sequence_counts;
    // fp32 [1] each; undefined when the loss is off. Under context or
    // sequence parallelism this rank's share of the whole sequences' loss.
    Tensor aux_loss, z_loss;
  };

  // Parameters named "<prefix>.router.weight" [E, h] (the config's dtype,
  // widened to fp32 for the router's GEMMs),
  // "<prefix>.experts.linear_fc1.weight" [E, f1, h] (f1 = 2f for SwiGLU),
  // "<prefix>.experts.linear_fc2.weight" [E, h, f], and
  // "<prefix>.shared_experts.linear_fc{1,2}.weight" when configured (and
  // "<prefix>.shared_experts.gate_weight" [1, h] with the gate), drawn
  // from N(0, init_std) with the config's seed. Under expert parallelism the
  // expert weights are this rank's E / EP experts of those ([E / EP, ...],
  // partition_dim 0, global_shape the full one); num_experts must divide.
  static absl::StatusOr<std::unique_ptr<MoeMlp>> Create(
      const std::string& prefix, const MoeMlpConfig& config,
      const ExpertParallelism& ep = {});

  // x [tokens, hidden] in the config's dtype; sequences: the micro-batch
  // size b (for seq_aux_loss; tokens = s * b).
  absl::StatusOr<Tensor> Forward(const Tensor& x, int64_t sequences,
                                 Activations* act) const;
  // dy [tokens, hidden]; loss_grad_scale: the gradient of the training loss
  // with respect to the balancing and z-losses (the loss scale over the
  // micro-batch count).
  absl::StatusOr<Tensor> Backward(const Tensor& dy, const Activations& act,
                                  float loss_grad_scale = 1.0f) const;

  // DeepSeek-V3's expert-bias step from the tokens each expert received
  // since the last call (summed over micro-batches).
  absl::Status UpdateExpertBias(const std::vector<int64_t>& tokens_per_expert,
                                float rate);

  // Data-parallel gradient reduction with Megatron's scaling: every main
  // gradient summed over its data-parallel ranks and divided by data's
  // size; router and shared expert over `data` (the dense DP x CP group),
  // the experts over `expert_data` (the ranks holding the same experts:
  // each expert's gradient already holds the tokens of its whole EP group).
  // Either group may be null (nothing to reduce over).
  absl::Status ReduceGradients(comm::ProcessGroup* data,
                               comm::ProcessGroup* expert_data) const;

  void AppendParameters(ParameterList* out) const;
  int64_t local_experts() const {
    return dispatcher_ ? dispatcher_->local_experts() : config_.num_experts;
  }
  const MoeMlpConfig& config() const { return config_; }
  // fp32 [E]; undefined without expert_bias. Not a parameter: no gradient
  // (checkpoints keep it as a buffer; a load writes into it).
  const Tensor& expert_bias() const { return expert_bias_; }
  Tensor& mutable_expert_bias() { return expert_bias_; }
  Parameter& router_weight() const { return *router_; }
  Parameter& fc1_weight() const { return *fc1_; }
  Parameter& fc2_weight() const { return *fc2_; }
  Parameter* shared_fc1_weight() const { return shared_fc1_.get(); }
  Parameter* shared_fc2_weight() const { return shared_fc2_.get(); }
  Parameter* shared_gate_weight() const { return shared_gate_.get(); }

 private:
  explicit MoeMlp(const MoeMlpConfig& config) : config_(config) {}
  int64_t fc1_outputs(int64_t f) const {
    return config_.activation == ExpertActivation::kSwiGLU ? 2 * f : f;
  }
  // Rows grouped by global expert -> the local experts' rows (EP, then
  // ETP gathering), and back (ETP reduce-scatter of partial sums, then EP).
  absl::StatusOr<Tensor> DispatchRows(const Tensor& rows,
                                      const Activations& act) const;
  absl::StatusOr<Tensor> CombineRows(const Tensor& rows,
                                     const Activations& act) const;
  absl::Status Activate(const Tensor& in, Tensor* out) const;
  absl::StatusOr<Tensor> RouterWeight32() const;
  // The shared expert's gate as a one-expert router (sigmoid, top-1, not
  // renormalised): its combine weight is the gate.
  absl::Status ActivateBackward(const Tensor& dout, const Tensor& in,
                                Tensor* din) const;
  // The ranks holding parts of each sequence: CP x (TP under SP).
  int sequence_shards() const;
  // The sequences the balancing loss averages over (b, or 1 for aux_loss).
  int64_t balance_sequences(int64_t sequences) const {
    return config_.load_balancing == LoadBalancing::kSeqAuxLoss ? sequences : 1;
  }
  // The whole sequences' routed counts (sequence_shards() > 1), into act.
  absl::Status SumSequenceCounts(int64_t sequences, Activations* act) const;
  ops::MoeSequenceTotals Totals(const Activations& act) const;
  // Token dropping under CP (host indices and weights [t, k]): the CP
  // ranks' slots gathered and dropped as the serial micro-batch's.
  absl::Status DropInContext(const Tensor& indices, const Tensor& weights,
                             int64_t sequences, const Device& device,
                             Tensor* kept_indices, Tensor* kept_weights) const;

  MoeMlpConfig config_;
  std::unique_ptr<TokenDispatcher> dispatcher_;      // Null without EP.
  std::unique_ptr<TokenDispatcher> etp_dispatcher_;  // Null without ETP.
  int64_t local_ffn_ = 0;                            // ffn_hidden_size / ETP.
  std::shared_ptr<Parameter> router_, fc1_, fc2_, shared_fc1_, shared_fc2_,
      shared_gate_;
  Tensor expert_bias_;
};

}  // namespace moe
}  // namespace mcc

#endif  // MODELS_MOE_MOE_MLP_H_
