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

// A GPT decoder built from the tensor- and sequence-parallel layers: word
// (vocab-parallel) and learned position embeddings, pre-norm blocks, a final
// norm and the output layer (tied to the word embedding unless untied), with
// vocab-parallel cross entropy. Every tensor-parallel layout starts from the
// serial model's weights and computes the same loss.
class GPTModel {
 public:
  static absl::StatusOr<std::unique_ptr<GPTModel>> Create(
      const GPTConfig& config, const parallel::LayerContext& context);

  // Forward and backward of one micro-batch: the parameters' main_grad
  // accumulate d(mean loss)/dparam * grad_scale. Returns the loss sum.
  absl::StatusOr<LossSum> ForwardBackward(const MicroBatch& batch,
                                          float grad_scale);
  // Forward only (evaluation).
  absl::StatusOr<LossSum> Forward(const MicroBatch& batch);

  // Logits of the last position of every sequence: fp32 [b, vocab] with the
  // full (gathered) vocabulary on every rank, for generation. tokens: int64
  // [b, s]; no dropout.
  absl::StatusOr<Tensor> LastTokenLogits(const Tensor& tokens);

  // Incremental decoding with a KV cache (no dropout; the model must be
  // built without sequence parallelism, which cannot split one new token:
  // the weights are the same, so build another model for decoding).
  // An empty cache for `batch` sequences of up to `capacity` positions.
  absl::StatusOr<KvCache> NewKvCache(int64_t batch, int64_t capacity) const;
  // Runs tokens int64 [b, s] from position 0, filling the cache, and
  // returns the last position's logits: fp32 [b, vocab], gathered over TP.
  absl::StatusOr<Tensor> Prefill(const Tensor& tokens, KvCache* cache);
  // Appends one token per sequence (int64 [b]) at position cache->length
  // and returns its logits as Prefill does.
  absl::StatusOr<Tensor> DecodeStep(const Tensor& next_tokens, KvCache* cache);

  // After the last micro-batch's backward: sums over TP the gradients that
  // sequence parallelism leaves partial (norm weights, row-parallel biases).
  absl::Status FinalizeGradients();
  void ZeroGradients();

  // Called during backward with the parameters whose gradient for this
  // micro-batch is complete (a layer's as soon as its backward ends), so
  // data parallelism can start reducing them while backward goes on.
  using GradReadyHook =
      std::function<absl::Status(const std::vector<Parameter*>& ready)>;
  void SetGradReadyHook(GradReadyHook hook) {
    grad_ready_hook_ = std::move(hook);
  }

  const ParameterList& parameters() const { return parameters_; }
  // Where the dropout stream stands (forward calls so far): part of the RNG
  // state a checkpoint saves, so a resumed run draws the same masks.
  uint64_t rng_calls() const { return forward_calls_; }
  void set_rng_calls(uint64_t calls) { forward_calls_ = calls; }
  const GPTConfig& config() const { return config_; }
  const parallel::LayerContext& context() const { return context_; }

 private:
  struct Record;
  absl::StatusOr<LossSum> Run(const MicroBatch& batch, bool backward,
                              float grad_scale);
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
  std::unique_ptr<parallel::VocabParallelEmbedding> word_embeddings_;
  std::shared_ptr<Parameter> position_embeddings_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<Norm> final_norm_;
  std::unique_ptr<parallel::ColumnParallelLinear> output_layer_;
  absl::Status GradsReady(const ParameterList& params) const;

  ParameterList parameters_;
  GradReadyHook grad_ready_hook_;
  uint64_t forward_calls_ = 0;
};

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_GPT_MODEL_H_
