#ifndef EXAMPLES_CUSTOM_MODEL_TINY_LM_H_
#define EXAMPLES_CUSTOM_MODEL_TINY_LM_H_

// A language model that megatron_cpp does not know: a token embedding, a
// stack of residual GELU-MLP blocks and an output layer, trained on next
// tokens. It is written against the model contract (@megatron_cpp//parallel:
// model) and the layers only (the parallel layers, and the mixture-of-experts
// layer of @megatron_cpp//models/moe in its MoE variant), never against
// megatron_cpp's GPT, so that data parallelism, ZeRO-3 and the pipeline
// schedules train it as they train the GPT.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "models/moe/moe_mlp.h"
#include "parallel/linear.h"
#include "parallel/mlp_block.h"
#include "parallel/model.h"
#include "parallel/vocab_parallel.h"

namespace tiny_lm {

struct TinyLmConfig {
  int64_t vocab = 37;
  int64_t hidden = 16;
  int64_t ffn_hidden = 32;
  int num_blocks = 4;
  int64_t seq_length = 12;
  int64_t sequences_per_microbatch = 2;
  // The MoE variant: each block's MLP is a mixture of num_experts GELU
  // experts of ffn_hidden (models/moe's MoeMlp), top-k routed, with the
  // balancing loss, trained with the LM loss. 0: the dense blocks.
  int num_experts = 0;
  int moe_topk = 2;
  float moe_aux_loss_coeff = 0.01f;
};

// One micro-batch: input token ids and the next tokens, int64 [tokens].
struct TinyLmBatch {
  mcc::Tensor ids;
  mcc::Tensor labels;
};

// Micro-batch `index` of step `step`: sequences from a fixed rule (each
// token mostly follows from the previous one) with a little noise, so the
// loss can fall. Deterministic; a few batches recur.
TinyLmBatch MakeBatch(const TinyLmConfig& config, int step, int index);

// Blocks [first_block, first_block + num_blocks) of the model: the whole
// model or one pipeline chunk. The chunk holding block 0 owns the embedding,
// the chunk holding the last block owns the output layer and the loss.
// Block i computes x + fc2_i(gelu(fc1_i(x))) (@megatron_cpp//parallel:
// mlp_block), or x + moe_i(x) in the MoE variant (the block's experts'
// weight gradients come in B under a split backward: MoeMlp has no deferred
// weight step; the balancing loss's gradient scales with the LM loss's).
// Parameters are named after
// their global position, so every split starts from the same weights.
// fp32, serial in the tensor dimension. Not thread-safe.
class TinyLm : public mcc::parallel::Model,
               public mcc::parallel::PipelineStage {
 public:
  static absl::StatusOr<std::unique_ptr<TinyLm>> Create(
      const TinyLmConfig& config, const mcc::parallel::LayerContext& context,
      int first_block, int num_blocks);

  // The micro-batches that pipeline steps address by index.
  void SetMicroBatches(std::shared_ptr<const std::vector<TinyLmBatch>> b) {
    batches_ = std::move(b);
  }

  // Model.
  const mcc::ParameterList& parameters() const override { return params_; }
  const std::vector<mcc::ParameterList>& units() const override {
    return units_;
  }
  mcc::comm::ProcessGroup* tensor_group() const override { return nullptr; }

  // PipelineStage: the residual stream, fp32 [tokens, hidden].
  bool takes_batch_input() const override { return embedding_ != nullptr; }
  bool computes_loss() const override { return head_ != nullptr; }
  absl::StatusOr<mcc::parallel::TensorSpec> InputSpec(
      int microbatch) const override;
  absl::StatusOr<mcc::parallel::TensorSpec> OutputSpec(
      int microbatch) const override;
  absl::StatusOr<mcc::parallel::StageOutput> ForwardStep(
      int microbatch, const mcc::Tensor& input, bool backward_after) override;
  absl::StatusOr<mcc::Tensor> BackwardStep(
      const mcc::Tensor& output_grad, float grad_scale,
      std::unique_ptr<mcc::parallel::ActivationRecord> record) override;
  // The split backward that zero-bubble schedules (--pipeline-schedule
  // zb-h1) run: B computes the input gradient and leaves the linear layers'
  // and the embedding's weight gradients, and the units' AfterBackward and
  // grad-ready hooks, in the record; W runs them. Without these overrides
  // the contract's defaults would run the whole backward in B, correct but
  // without the schedule's gain. Unit hooks that do not allow the split
  // (UnitHooks::AllowsSplitBackward) get those defaults.
  absl::StatusOr<mcc::Tensor> BackwardInputStep(
      const mcc::Tensor& output_grad, float grad_scale,
      std::unique_ptr<mcc::parallel::ActivationRecord>* record) override;
  absl::Status BackwardWeightStep(
      std::unique_ptr<mcc::parallel::ActivationRecord> record) override;

 private:
  struct Record;

  // The backward; with `deferred`, the input-gradient step of the split.
  absl::StatusOr<mcc::Tensor> Backward(
      const mcc::Tensor& output_grad, float grad_scale, Record* rec,
      mcc::parallel::DeferredWeightGrads* deferred);

  TinyLm() = default;
  absl::StatusOr<const TinyLmBatch*> Batch(int microbatch) const;
  // The unit index of the blocks' first unit (after the embedding's).
  int first_block_unit() const { return embedding_ ? 1 : 0; }
  int local_blocks() const {
    return static_cast<int>(blocks_.size() + moe_blocks_.size());
  }

  TinyLmConfig config_;
  mcc::parallel::LayerContext context_;
  int first_block_ = 0;
  std::unique_ptr<mcc::parallel::VocabParallelEmbedding> embedding_;
  std::vector<mcc::parallel::MlpBlock> blocks_;
  std::vector<std::unique_ptr<mcc::moe::MoeMlp>> moe_blocks_;  // MoE variant
  std::unique_ptr<mcc::parallel::ColumnParallelLinear> head_;
  mcc::ParameterList params_;
  std::vector<mcc::ParameterList> units_;
  std::shared_ptr<const std::vector<TinyLmBatch>> batches_;
};

}  // namespace tiny_lm

#endif  // EXAMPLES_CUSTOM_MODEL_TINY_LM_H_
