#ifndef MODELS_GPT_GPT_MODEL_H_
#define MODELS_GPT_GPT_MODEL_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/kv_cache.h"
#include "models/gpt/transformer_layer.h"
#include "parallel/linear.h"
#include "parallel/vocab_parallel.h"

namespace mcc {
namespace gpt {

// One micro-batch of token ids, as the loader yields them.
struct MicroBatch {
  Tensor tokens;     // int64 [b, s]
  Tensor labels;     // int64 [b, s]; -100 ignores a position
  Tensor loss_mask;  // fp32 [b, s]; undefined means all ones
};

// The summed loss of a micro-batch and the number of tokens it covers.
struct LossSum {
  double sum = 0.0;
  double tokens = 0.0;
  double mean() const { return tokens > 0 ? sum / tokens : 0.0; }
};

// Which part of the decoder one model (a pipeline stage, or one virtual
// stage of an interleaved pipeline) holds. Layers keep their global numbers
// (parameter names and dropout streams), so any split computes what the
// whole model does.
struct ModelChunkSpec {
  int first_layer = 0;
  int num_layers = -1;       // -1: all of config.num_layers from first_layer.
  bool pre_process = true;   // Word and position embeddings (first stage).
  bool post_process = true;  // Final norm, output layer and loss (last).
  // Another stage holds the other copy of the tied word-embedding /
  // output-layer weight: its gradient is summed with that copy's
  // (SyncSharedGradients) instead of being reported ready during backward.
  bool share_embedding_with_other_stage = false;
};

// Called around each unit's compute (a unit is the embeddings, one layer, or
// the head: final norm and untied output layer), so a fully sharded wrapper
// can gather a unit's parameters just before it computes, prefetch the next
// and release them after. Calls nest: the head of a tied model also opens
// the embedding unit around its output layer. Units are numbered in forward
// order as units() lists them.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual absl::Status BeforeForward(int unit) = 0;
  virtual absl::Status AfterForward(int unit) = 0;
  // Before anything of the unit runs in the backward pass (including a
  // recomputed forward).
  virtual absl::Status BeforeBackward(int unit) = 0;
  // The unit's parameter gradients for this micro-batch are complete.
  virtual absl::Status AfterBackward(int unit) = 0;
};

// The activations one micro-batch leaves in a model chunk between its
// forward and backward steps (pipeline schedules keep several).
struct ChunkRecord {
  int64_t b = 0, s = 0;
  uint64_t call = 0;
  Tensor ids, positions;  // pre_process
  std::vector<TransformerLayer::Activations> layers;
  std::vector<Tensor> chunk_inputs;  // Recomputed chunks' inputs.
  std::vector<int> chunk_len;
  Norm::Activations final_act;  // post_process
  parallel::ColumnParallelLinear::Activations head_act;
  parallel::VocabParallelCrossEntropy::Activations ce_act;
  Tensor mask, labels;
  LossSum loss;
  bool pending = false;  // Forward done, backward not yet.
};

// A GPT decoder built from the tensor- and sequence-parallel layers: word
// (vocab-parallel) and learned position embeddings, pre-norm blocks, a final
// norm and the output layer (tied to the word embedding unless untied), with
// vocab-parallel cross entropy. Every tensor-parallel layout starts from the
// serial model's weights and computes the same loss: the vocabulary rows
// padded for TP (config.padded_vocab_size) are zero, masked out of the
// softmax and never trained. A model may hold only
// a chunk of the decoder (ModelChunkSpec) for pipeline parallelism.
class GPTModel {
 public:
  static absl::StatusOr<std::unique_ptr<GPTModel>> Create(
      const GPTConfig& config, const parallel::LayerContext& context,
      const ModelChunkSpec& chunk = {});

  // One pipeline step of a micro-batch through this chunk. input: the
  // previous chunk's output hidden states [s * b (/ TP under SP), hidden]
  // (ignored with pre_process, which embeds batch.tokens). Returns the
  // output hidden states, or with post_process an empty tensor and the loss
  // in record->loss. With backward_after false (evaluation) no dropout
  // runs and nothing is kept for backward.
  absl::StatusOr<Tensor> ForwardStep(const MicroBatch& batch,
                                     const Tensor& input, bool backward_after,
                                     ChunkRecord* record);
  // The backward of a ForwardStep: output_grad is d(loss)/d(output) from
  // the next chunk (ignored with post_process, which starts from the loss,
  // scaled by grad_scale / tokens). Returns d(loss)/d(input), or an empty
  // tensor with pre_process. Releases the record's activations.
  absl::StatusOr<Tensor> BackwardStep(const Tensor& output_grad,
                                      float grad_scale, ChunkRecord* record);
  // The shape and dtype of the hidden states passed between chunks for a
  // micro-batch of b sequences of length s.
  Shape HiddenShape(int64_t b, int64_t s) const;

  // Forward and backward of one micro-batch: the parameters' main_grad
  // accumulate d(mean loss)/dparam * grad_scale. Returns the loss sum.
  absl::StatusOr<LossSum> ForwardBackward(const MicroBatch& batch,
                                          float grad_scale);
  // Forward only (evaluation).
  absl::StatusOr<LossSum> Forward(const MicroBatch& batch);

  // Logits of the last position of every sequence: fp32 [b, vocab] with the
  // full (gathered) vocabulary on every rank, for generation; the columns of
  // the TP padding are dropped. tokens: int64 [b, s]; no dropout.
  absl::StatusOr<Tensor> LastTokenLogits(const Tensor& tokens);

  // Incremental decoding with a KV cache (no dropout; the model must be
  // built without sequence parallelism, which cannot split one new token:
  // the weights are the same, so build another model for decoding).
  // An empty cache for `batch` sequences of up to `capacity` positions.
  absl::StatusOr<KvCache> NewKvCache(int64_t batch, int64_t capacity) const;
  // Runs tokens int64 [b, s] from position 0, filling the cache, and
  // returns the last position's logits: fp32 [b, vocab], gathered over TP
  // (without the padding columns).
  absl::StatusOr<Tensor> Prefill(const Tensor& tokens, KvCache* cache);
  // Appends one token per sequence (int64 [b]) at position cache->length
  // and returns its logits as Prefill does.
  absl::StatusOr<Tensor> DecodeStep(const Tensor& next_tokens, KvCache* cache);

  // After the last micro-batch's backward: sums over TP the gradients that
  // sequence parallelism leaves partial (norm weights, row-parallel biases).
  absl::Status FinalizeGradients();
  // After the last micro-batch's backward and before data-parallel
  // reduction: sums the tied embedding / output weight's gradient with the
  // other stage's copy over `embedding_group` (the first and last pipeline
  // stages), then reports it ready. Nothing without a shared weight.
  absl::Status SyncSharedGradients(comm::ProcessGroup* embedding_group);
  void ZeroGradients();

  // Called during backward with the parameters whose gradient for this
  // micro-batch is complete (a layer's as soon as its backward ends), so
  // data parallelism can start reducing them while backward goes on.
  using GradReadyHook =
      std::function<absl::Status(const std::vector<Parameter*>& ready)>;
  void SetGradReadyHook(GradReadyHook hook) {
    grad_ready_hook_ = std::move(hook);
  }

  // Parameters per unit, in forward order (see UnitHooks).
  const std::vector<ParameterList>& units() const { return units_; }
  void SetUnitHooks(UnitHooks* hooks) { unit_hooks_ = hooks; }

  const ParameterList& parameters() const { return parameters_; }
  const ModelChunkSpec& chunk() const { return chunk_; }
  // Where the dropout stream stands (forward calls so far): part of the RNG
  // state a checkpoint saves, so a resumed run draws the same masks.
  uint64_t rng_calls() const { return forward_calls_; }
  void set_rng_calls(uint64_t calls) { forward_calls_ = calls; }
  const GPTConfig& config() const { return config_; }
  const parallel::LayerContext& context() const { return context_; }

 private:
  absl::StatusOr<LossSum> Run(const MicroBatch& batch, bool backward,
                              float grad_scale);
  uint64_t DropoutOffset(uint64_t call, int site_block, int64_t b,
                         int64_t s) const;
  absl::Status Hook(absl::Status (UnitHooks::*fn)(int), int unit) const;
  absl::Status LayerForward(int i, const Tensor& x, const ChunkRecord& rec,
                            TransformerLayer::Activations* act, Tensor* out);
  absl::Status CheckWholeModel(const char* what) const;
  absl::Status CheckBatch(const MicroBatch& batch) const;
  // Word plus position embeddings of sequence-major ids, with dropout at
  // `offset` when p > 0, split along the sequence under SP.
  // tokens [b, n] at positions [cache->length, + n), through the cache.
  absl::StatusOr<Tensor> Extend(const Tensor& tokens, KvCache* cache);
  // Final norm and output layer of the last position of sequence-major
  // hidden states x [s * b, h] (this rank's rows under SP): fp32 [b, vocab].
  absl::StatusOr<Tensor> LastPositionLogits(const Tensor& x, int64_t b,
                                            int64_t s) const;
  absl::StatusOr<Tensor> Embed(const Tensor& ids, const Tensor& positions,
                               uint64_t offset, bool dropout) const;

  GPTConfig config_;
  parallel::LayerContext context_;
  ModelChunkSpec chunk_;
  std::unique_ptr<parallel::VocabParallelEmbedding> word_embeddings_;
  std::shared_ptr<Parameter> position_embeddings_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<Norm> final_norm_;
  std::unique_ptr<parallel::ColumnParallelLinear> output_layer_;
  absl::Status GradsReady(const ParameterList& params) const;

  ParameterList parameters_;
  std::vector<ParameterList> units_;
  int embedding_unit_ = -1, first_layer_unit_ = 0, head_unit_ = -1;
  UnitHooks* unit_hooks_ = nullptr;
  int64_t vocab_start_ = 0;  // First vocabulary row of this TP rank.
  GradReadyHook grad_ready_hook_;
  uint64_t forward_calls_ = 0;
};

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_GPT_MODEL_H_
