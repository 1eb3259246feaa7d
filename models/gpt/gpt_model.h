#ifndef MODELS_GPT_GPT_MODEL_H_
#define MODELS_GPT_GPT_MODEL_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/activation_offload.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/transformer_layer.h"
#include "parallel/linear.h"
#include "parallel/model.h"
#include "parallel/vocab_parallel.h"

namespace mcc {
namespace gpt {

// One micro-batch of token ids, as the loader yields them.
struct MicroBatch {
  Tensor tokens;     // int64 [b, s]
  Tensor labels;     // int64 [b, s]; -100 ignores a position
  Tensor loss_mask;  // fp32 [b, s]; undefined means all ones
  // Packed documents (--reset-attention-mask): int32 [b, s] on the host,
  // where each token's document starts; a token attends only within its
  // document. Undefined: one document a sequence.
  Tensor document_start;
  // --reset-position-ids: int64 [b, s] on the model's device, each token's
  // position for the learned position embeddings. Rotary positions stay the
  // sequence's (as Megatron's outside the THD format): a shift common to a
  // document changes none of its attention scores. Undefined: 0, 1, ...
  Tensor position_ids;
};

// What the training forwards of one MoE layer routed since the model's last
// TakeMoeStats (summed over micro-batches, this rank's tokens; under context
// or sequence parallelism the whole sequences', summed over the CP and TP
// groups).
struct MoeLayerStats {
  int layer = 0;  // Global layer number.
  std::vector<int64_t> tokens_per_expert;
  // The balancing loss and the z-loss (each times its coefficient, as
  // trained), summed over micro-batches; 0 when off.
  double aux_loss_sum = 0, z_loss_sum = 0;
  int64_t micro_batches = 0;
};

// The loss sum is the model contract's.
using LossSum = parallel::LossSum;

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
  // That other copy is another chunk of this stage (ZB-V's stage 0 holds
  // the embeddings and the output layer): the output layer's copy is left
  // out of the gradient norm.
  bool embedding_copy_on_this_stage = false;
};

// The activations one micro-batch leaves in a model chunk between its
// forward and backward steps (pipeline schedules keep several).
struct ChunkRecord : parallel::ActivationRecord {
  int64_t b = 0, s = 0;
  uint64_t call = 0;
  Tensor ids, positions;  // pre_process
  // Packed documents / sliding window: the first key of every query of the
  // whole sequence (TransformerLayer::Activations::first_key).
  Tensor first_key;
  std::vector<TransformerLayer::Activations> layers;
  std::vector<Tensor> chunk_inputs;  // Recomputed chunks' inputs.
  std::vector<int> chunk_len;
  Norm::Activations final_act;  // post_process
  parallel::ColumnParallelLinear::Activations head_act;
  parallel::VocabParallelCrossEntropy::Activations ce_act;
  // --cpu-offloading: the activations of local layer i (of a recomputed
  // chunk starting at i: its input) while they wait in host memory.
  std::vector<std::unique_ptr<ActivationOffloader::Group>> offloaded;
  Tensor mask;           // Sequence-major loss mask; undefined: all ones.
  Tensor loss_sum;       // ops::LossSum's fp32 [4], on the model's device.
  bool pending = false;  // Forward done, backward not yet.
  // A split backward's weight gradients and hooks, from B for W.
  parallel::DeferredWeightGrads weight_grads;
};

// A GPT decoder built from the tensor- and sequence-parallel layers: word
// (vocab-parallel) and learned position embeddings, pre-norm blocks, a final
// norm and the output layer (tied to the word embedding unless untied), with
// vocab-parallel cross entropy. Every tensor-parallel layout starts from the
// serial model's weights and computes the same loss: the vocabulary rows
// padded for TP (config.padded_vocab_size) are zero, masked out of the
// softmax and never trained. A model may hold only
// a chunk of the decoder (ModelChunkSpec) for pipeline parallelism.
//
// Context parallelism (context.cp_group of size C > 1): micro-batches stay
// whole ([b, S] on every CP rank, as the loader gives them); each rank
// computes its two chunks of every sequence (chunks i and 2C - 1 - i,
// parallel/context_parallel/chunk_layout.h), so hidden states between
// stages are [S / C * b (/ TP under SP), hidden]. Positions and the causal
// mask follow the global positions, the loss sum and token count are summed
// over the CP group (every CP rank reports the micro-batch's loss), and the
// backward scales its gradients by C because data parallelism averages them
// over DP x CP. LastTokenLogits and attention dropout are refused under
// CP; hidden-dropout masks differ from the serial run's.
//
// Implements the model contract (parallel/model.h): units are the
// embeddings (pre_process), each layer, and the head (post_process: final
// norm and untied output layer; a tied head also opens the embedding unit
// around its output layer). As a pipeline stage it takes micro-batch i of
// those given to SetMicroBatches and passes hidden states
// [s * b (/ TP under SP), hidden] in the model dtype between chunks.
//
// Device: everything the model holds or computes (parameters, main_grad,
// activations, logits, the loss) lives on context.device, and
// micro-batch tensors and stage inputs must be there too. The model reaches
// that memory only through ops (kernels), collectives and the copy hook;
// the only device-to-host reads are the loss sums returned as host values
// (ForwardBackward, Forward, StageOutput::loss), one copy each.
//
// Activation offloading (config.cpu_offloading, a device only): during a
// training forward, what each of this chunk's first
// config.cpu_offloading_num_layers layers saves for its backward (a
// recomputed chunk: its input) moves to pinned host memory on a side
// stream, and the backward brings each back one step ahead
// (core/activation_offload.h); results are unchanged bit for bit.
class GPTModel : public parallel::Model, public parallel::PipelineStage {
 public:
  static absl::StatusOr<std::unique_ptr<GPTModel>> Create(
      const GPTConfig& config, const parallel::LayerContext& context,
      const ModelChunkSpec& chunk = {});

  // The micro-batches the pipeline steps address by index, until the next
  // call (every chunk of a step may share one list).
  void SetMicroBatches(std::shared_ptr<const std::vector<MicroBatch>> batches);
  // The list SetMicroBatches gave last (null before the first call).
  std::shared_ptr<const std::vector<MicroBatch>> micro_batches() const {
    return batches_;
  }

  // parallel::PipelineStage. ForwardStep embeds micro-batch i's tokens
  // (pre_process) and computes its loss from its labels (post_process);
  // BackwardStep starts from that loss scaled by grad_scale / tokens.
  bool takes_batch_input() const override { return chunk_.pre_process; }
  bool computes_loss() const override { return chunk_.post_process; }
  absl::StatusOr<parallel::TensorSpec> InputSpec(int microbatch) const override;
  absl::StatusOr<parallel::TensorSpec> OutputSpec(
      int microbatch) const override;
  absl::StatusOr<parallel::StageOutput> ForwardStep(
      int microbatch, const Tensor& input, bool backward_after) override;
  absl::StatusOr<Tensor> BackwardStep(
      const Tensor& output_grad, float grad_scale,
      std::unique_ptr<parallel::ActivationRecord> record) override;
  // The split backward (parallel/model.h): B leaves the linear layers' and
  // the embeddings' weight gradients, and the units' AfterBackward and
  // grad-ready hooks, in the record for W; norm weights get theirs in B.
  // While a unit hook does not allow the split (UnitHooks::
  // AllowsSplitBackward; DDP's and FSDP's do), B runs the whole backward
  // and W nothing.
  absl::StatusOr<Tensor> BackwardInputStep(
      const Tensor& output_grad, float grad_scale,
      std::unique_ptr<parallel::ActivationRecord>* record) override;
  absl::Status BackwardWeightStep(
      std::unique_ptr<parallel::ActivationRecord> record) override;
  // The shape of the hidden states passed between chunks for a micro-batch
  // of b sequences of length s.
  Shape HiddenShape(int64_t b, int64_t s) const;

  // Forward and backward of one micro-batch: the parameters' main_grad
  // accumulate d(mean loss)/dparam * grad_scale. Returns the loss sum, read
  // to the host (one device-to-host copy off the CPU).
  absl::StatusOr<LossSum> ForwardBackward(const MicroBatch& batch,
                                          float grad_scale);
  // Forward only (evaluation).
  absl::StatusOr<LossSum> Forward(const MicroBatch& batch);

  // Logits of the last position of every sequence: fp32 [b, vocab] with the
  // full (gathered) vocabulary on every rank; the columns of the TP padding
  // are dropped. tokens: int64 [b, s]; no dropout. One forward pass over
  // the whole sequence: a reference for tests and tools (generation is the
  // inference engine's, inference/).
  absl::StatusOr<Tensor> LastTokenLogits(const Tensor& tokens);

  // parallel::Model. Gradient finalisation is the contract's: the tied
  // embedding / output weight of a pipelined model is the parameter shared
  // with the other stage (SyncSharedGradients over the embedding group);
  // FinalizeGradients sums the sequence-parallel gradients over TP.
  const ParameterList& parameters() const override { return parameters_; }
  const std::vector<ParameterList>& units() const override { return units_; }
  comm::ProcessGroup* tensor_group() const override {
    return context_.tp_group;
  }

  // Mixture of experts. The router loads and losses of this chunk's MoE
  // layers since the last call (empty for a dense model); one small
  // device-to-host copy per MoE layer. Collective over the CP group (and
  // the TP group under sequence parallelism) when it has more than one rank
  // and this chunk has MoE layers.
  absl::StatusOr<std::vector<MoeLayerStats>> TakeMoeStats();
  // --moe-router-enable-expert-bias: steps every expert bias of this chunk
  // by the tokens its layer routed in the training forwards since the last
  // call, summed over dp_group (null: this rank's) and the CP group and
  // the TP group under SP (the whole sequences'), as Megatron after each
  // step. Collective over those
  // groups when they have more than one rank and this chunk has expert
  // biases.
  absl::Status UpdateExpertBias(comm::ProcessGroup* dp_group);
  // Tensors checkpoints keep beside the parameters, with no gradient (the
  // routers' expert biases), replicated, as Parameters that view them.
  const ParameterList& buffers() const { return buffers_; }

  const ModelChunkSpec& chunk() const { return chunk_; }
  // Where the dropout stream stands (forward calls so far): part of the RNG
  // state a checkpoint saves, so a resumed run draws the same masks.
  uint64_t rng_calls() const { return forward_calls_; }
  void set_rng_calls(uint64_t calls) { forward_calls_ = calls; }
  const GPTConfig& config() const { return config_; }
  const parallel::LayerContext& context() const { return context_; }
  // The output layer (null off the last pipeline stage).
  const parallel::ColumnParallelLinear* output_layer() const {
    return output_layer_.get();
  }
  // This chunk's decoder layers, in order.
  int num_local_layers() const { return static_cast<int>(layers_.size()); }
  TransformerLayer* layer(int i) { return layers_[i].get(); }
  const TransformerLayer* layer(int i) const { return layers_[i].get(); }
  // --cpu-offloading: how many of this chunk's first layers offload their
  // activations during a training forward (0 without), and the offloader's
  // totals (zeros without).
  int num_offloaded_layers() const { return offload_layers_; }
  OffloadStats offload_stats() const;

 private:
  absl::StatusOr<LossSum> Run(const MicroBatch& batch, bool backward,
                              float grad_scale);
  // One pipeline step of `batch` through this chunk (see ForwardStep and
  // BackwardStep); the loss lands in record->loss.
  absl::StatusOr<Tensor> ChunkForward(const MicroBatch& batch,
                                      const Tensor& input, bool backward_after,
                                      ChunkRecord* record);
  // With `deferred`, the input-gradient step of a split backward.
  absl::StatusOr<Tensor> ChunkBackward(
      const Tensor& output_grad, float grad_scale, ChunkRecord* record,
      parallel::DeferredWeightGrads* deferred = nullptr);
  absl::StatusOr<const MicroBatch*> Batch(int microbatch) const;
  uint64_t DropoutOffset(uint64_t call, int site_block, int64_t b,
                         int64_t s) const;
  absl::Status LayerForward(int i, const Tensor& x, const ChunkRecord& rec,
                            TransformerLayer::Activations* act, Tensor* out);
  absl::Status CheckWholeModel(const char* what) const;
  // What local layer i leaves for its backward, as offloading slots: a
  // recomputed chunk's input at its first layer (nothing for its other
  // layers), else the layer's activations.
  static std::vector<Tensor*> OffloadSlots(ChunkRecord* rec, int i);
  // Adds what local layer i's training forward routed (an MoE layer's) to
  // its accumulator.
  absl::Status RecordMoe(int local_layer,
                         const TransformerLayer::Activations& act);
  absl::Status CheckBatch(const MicroBatch& batch) const;
  // Final norm and output layer of the last position of sequence-major
  // hidden states x [s * b, h] (this rank's rows under SP): fp32 [b, vocab].
  absl::StatusOr<Tensor> LastPositionLogits(const Tensor& x, int64_t b,
                                            int64_t s) const;
  // Word plus position embeddings of sequence-major ids, with dropout at
  // `offset` when p > 0, split along the sequence under SP.
  absl::StatusOr<Tensor> Embed(const Tensor& ids, const Tensor& positions,
                               uint64_t offset, bool dropout) const;
  // Positions first, first + 1, ... of b sequences of length s in
  // sequence-major order, int64 [s * b] on the model's device (undefined
  // without learned position embeddings, which alone look them up).
  absl::StatusOr<Tensor> SeqMajorPositions(int64_t b, int64_t s,
                                           int64_t first) const;
  // Context parallelism (context_.cp_group): its size (1 without), this
  // rank's two chunks of a full-sequence micro-batch (the batch itself
  // without CP), the positions of this rank's s tokens, and where its
  // embedding-dropout masks start.
  int cp_size() const;
  absl::StatusOr<MicroBatch> ContextSlice(const MicroBatch& full) const;
  absl::StatusOr<Tensor> LocalPositions(int64_t b, int64_t s) const;
  uint64_t EmbeddingDropoutOffset(uint64_t call, int64_t b, int64_t s) const;
  // The groups holding the other parts of this rank's sequences: CP, and
  // TP under sequence parallelism (each TP rank routes its own tokens).
  std::vector<comm::ProcessGroup*> SequenceShardGroups() const;
  // Per-expert counts (or a loss share) summed over those groups (the
  // whole sequences').
  absl::StatusOr<std::vector<int64_t>> SumOverSequenceShards(
      std::vector<int64_t> counts) const;
  absl::Status SumOverSequenceShards(Tensor* t) const;

  GPTConfig config_;
  parallel::LayerContext context_;
  ModelChunkSpec chunk_;
  std::unique_ptr<parallel::VocabParallelEmbedding> word_embeddings_;
  std::shared_ptr<Parameter> position_embeddings_;
  // 0, 1, ..., max_positions - 1 on the device (learned positions only):
  // copied there once, so no step copies positions from the host.
  Tensor position_ids_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<Norm> final_norm_;
  std::unique_ptr<parallel::ColumnParallelLinear> output_layer_;

  ParameterList parameters_;
  ParameterList buffers_;
  std::vector<ParameterList> units_;
  // One per MoE layer of this chunk, in order.
  struct MoeAccumulator {
    int local_layer = 0, layer = 0;
    std::vector<int64_t> log_tokens, bias_tokens;
    Tensor aux_sum, z_sum;  // fp32 [1] on the device.
    int64_t micro_batches = 0;
  };
  std::vector<MoeAccumulator> moe_;
  int embedding_unit_ = -1, first_layer_unit_ = 0, head_unit_ = -1;
  int64_t vocab_start_ = 0;  // First vocabulary row of this TP rank.
  std::shared_ptr<const std::vector<MicroBatch>> batches_;
  uint64_t forward_calls_ = 0;
  // --cpu-offloading (null without) and the local layers it covers.
  std::unique_ptr<ActivationOffloader> offloader_;
  int offload_layers_ = 0;
  bool offload_logged_ = false;
};

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_GPT_MODEL_H_
