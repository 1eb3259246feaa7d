#include "models/gpt/gpt_model.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/gemm.h"
#include "core/ops/index_check.h"
#include "core/ops/layout.h"
#include "core/ops/loss_sum.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "models/gpt/document_mask.h"
#include "parallel/context_parallel/chunk_layout.h"
#include "parallel/mappings.h"

namespace mcc {
namespace gpt {

using parallel::GroupRank;
using parallel::GroupSize;
using parallel::InitSpec;

absl::StatusOr<std::unique_ptr<GPTModel>> GPTModel::Create(
    const GPTConfig& config, const parallel::LayerContext& context,
    const ModelChunkSpec& chunk) {
  MCC_RETURN_IF_ERROR(
      config.Validate(GroupSize(context.tp_group), context.sequence_parallel));
  const int num_layers = chunk.num_layers >= 0
                             ? chunk.num_layers
                             : config.num_layers - chunk.first_layer;
  if (chunk.first_layer < 0 || num_layers < 0 ||
      chunk.first_layer + num_layers > config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model chunk: layers [", chunk.first_layer, ", ",
        chunk.first_layer + num_layers, ") are outside the model's ",
        config.num_layers, " layers"));
  }
  auto model = std::unique_ptr<GPTModel>(new GPTModel);
  model->config_ = config;
  model->context_ = context;
  model->chunk_ = chunk;
  model->chunk_.num_layers = num_layers;
  const bool tied = !config.untie_embeddings_and_output_weights;
  const auto init =
      InitSpec::Normal(static_cast<float>(config.init_method_std));
  const int tp = std::max(1, GroupSize(context.tp_group));
  const int64_t padded_vocab = config.padded_vocab_size(tp);
  if (chunk.pre_process || (chunk.post_process && tied)) {
    // The last stage of a tied pipeline owns a copy of the word embedding
    // (same name, same initial values) as its output weight.
    MCC_ASSIGN_OR_RETURN(
        model->word_embeddings_,
        parallel::VocabParallelEmbedding::Create(
            "embedding.word_embeddings.weight", config.vocab_size, padded_vocab,
            config.hidden_size, init, context));
    if (tied && chunk.share_embedding_with_other_stage) {
      model->word_embeddings_->weight()->shared_with_other_stage = true;
      // The output layer's copy on the embeddings' stage (ZB-V's stage 0).
      model->word_embeddings_->weight()->norm_counted_by_other_copy =
          chunk.embedding_copy_on_this_stage && !chunk.pre_process;
    }
  }
  if (chunk.pre_process) {
    ParameterList unit = {model->word_embeddings_->weight()};
    if (config.position_embedding == PositionEmbedding::kLearned) {
      MCC_ASSIGN_OR_RETURN(
          model->position_embeddings_,
          parallel::MakeParameter("embedding.position_embeddings.weight",
                                  {config.max_positions(), config.hidden_size},
                                  -1, init, context, /*weight_decay=*/true));
      unit.push_back(model->position_embeddings_);
      std::vector<int64_t> ids(config.max_positions());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
      MCC_ASSIGN_OR_RETURN(Tensor host_ids,
                           Tensor::FromInts(ids, {config.max_positions()}));
      // Through the device's copy hook, once at construction.
      MCC_ASSIGN_OR_RETURN(model->position_ids_, host_ids.To(context.device));
    }
    model->embedding_unit_ = 0;
    model->units_.push_back(unit);
  }
  model->first_layer_unit_ = static_cast<int>(model->units_.size());
  for (int i = chunk.first_layer; i < chunk.first_layer + num_layers; ++i) {
    MCC_ASSIGN_OR_RETURN(auto layer,
                         TransformerLayer::Create(i, config, context));
    ParameterList unit;
    layer->AppendParameters(&unit);
    model->units_.push_back(unit);
    if (moe::MoeMlp* moe = layer->moe()) {
      MoeAccumulator acc;
      acc.local_layer = static_cast<int>(model->layers_.size());
      acc.layer = i;
      acc.log_tokens.assign(config.num_experts, 0);
      acc.bias_tokens.assign(config.num_experts, 0);
      acc.aux_sum = Tensor::Zeros({1}, DType::kFloat32, context.device);
      acc.z_sum = Tensor::Zeros({1}, DType::kFloat32, context.device);
      model->moe_.push_back(std::move(acc));
      if (moe->expert_bias().defined()) {
        // A checkpoint buffer (no gradient, no optimizer state) that views
        // the router's bias, so loads write into it.
        auto buffer = std::make_shared<Parameter>();
        buffer->name =
            absl::StrCat("decoder.layers.", i, ".mlp.router.expert_bias");
        buffer->value = moe->expert_bias();
        buffer->global_shape = buffer->value.shape();
        buffer->weight_decay = false;
        model->buffers_.push_back(buffer);
      }
    }
    model->layers_.push_back(std::move(layer));
  }
  if (chunk.post_process) {
    ParameterList unit;
    MCC_ASSIGN_OR_RETURN(
        model->final_norm_,
        Norm::Create("decoder.final_layernorm", config, context));
    model->final_norm_->AppendParameters(&unit);
    if (!tied) {
      parallel::LinearOptions options;
      options.bias = false;
      options.weight_init = init;
      // The output layer stays out of FP8, as in Megatron and
      // TransformerEngine: the logits need the range.
      parallel::LayerContext head_context = context;
      head_context.fp8.reset();
      MCC_ASSIGN_OR_RETURN(model->output_layer_,
                           parallel::ColumnParallelLinear::Create(
                               "output_layer", config.hidden_size, padded_vocab,
                               options, head_context));
      MCC_RETURN_IF_ERROR(parallel::MarkVocabPadding(
          model->output_layer_->weight().get(), config.vocab_size));
      model->output_layer_->AppendParameters(&unit);
    } else {
      MCC_ASSIGN_OR_RETURN(
          model->output_layer_,
          parallel::ColumnParallelLinear::CreateTied(
              "output_layer", model->word_embeddings_->weight(), context));
      if (!chunk.pre_process) unit.push_back(model->word_embeddings_->weight());
    }
    model->head_unit_ = static_cast<int>(model->units_.size());
    model->units_.push_back(unit);
  }
  if (config.cpu_offloading) {
    MCC_ASSIGN_OR_RETURN(model->offloader_,
                         ActivationOffloader::Create(context.device));
    model->offload_layers_ =
        std::min(config.cpu_offloading_num_layers, num_layers);
  }
  model->vocab_start_ = GroupRank(context.tp_group) * (padded_vocab / tp);
  // The flat list keeps the order of the whole model: embeddings, layers,
  // final norm, output layer, the owned tied copy last.
  for (const ParameterList& unit : model->units_) {
    for (const auto& p : unit) {
      if (!chunk.pre_process && model->word_embeddings_ != nullptr &&
          p == model->word_embeddings_->weight()) {
        continue;
      }
      model->parameters_.push_back(p);
    }
  }
  if (!chunk.pre_process && model->word_embeddings_ != nullptr) {
    model->parameters_.push_back(model->word_embeddings_->weight());
  }
  return model;
}

Shape GPTModel::HiddenShape(int64_t b, int64_t s) const {
  const int64_t tokens =
      context_.sequence_parallel ? s * b / GroupSize(context_.tp_group) : s * b;
  return {tokens, config_.hidden_size};
}

void GPTModel::SetMicroBatches(
    std::shared_ptr<const std::vector<MicroBatch>> batches) {
  batches_ = std::move(batches);
}

absl::StatusOr<const MicroBatch*> GPTModel::Batch(int microbatch) const {
  const int n = batches_ == nullptr ? 0 : static_cast<int>(batches_->size());
  if (microbatch < 0 || microbatch >= n) {
    return absl::OutOfRangeError(absl::StrCat(
        "model chunk from layer ", chunk_.first_layer, ": micro-batch ",
        microbatch, " asked for, but SetMicroBatches gave ", n));
  }
  return &(*batches_)[microbatch];
}

absl::StatusOr<parallel::TensorSpec> GPTModel::InputSpec(int microbatch) const {
  MCC_ASSIGN_OR_RETURN(const MicroBatch* batch, Batch(microbatch));
  MCC_RETURN_IF_ERROR(CheckBatch(*batch));
  parallel::TensorSpec spec;
  spec.shape =
      HiddenShape(batch->tokens.size(0), batch->tokens.size(1) / cp_size());
  spec.dtype = context_.dtype;
  // The hidden states live on the model's device.
  spec.device = context_.device;
  return spec;
}

absl::StatusOr<parallel::TensorSpec> GPTModel::OutputSpec(
    int microbatch) const {
  // Every chunk passes on hidden states shaped as it receives them.
  return InputSpec(microbatch);
}

absl::StatusOr<parallel::StageOutput> GPTModel::ForwardStep(
    int microbatch, const Tensor& input, bool backward_after) {
  MCC_ASSIGN_OR_RETURN(const MicroBatch* batch, Batch(microbatch));
  auto record = std::make_unique<ChunkRecord>();
  parallel::StageOutput out;
  MCC_ASSIGN_OR_RETURN(
      out.output, ChunkForward(*batch, input, backward_after, record.get()));
  // Stays on the device (see parallel::StageOutput).
  out.loss_sum = record->loss_sum;
  if (backward_after) out.record = std::move(record);
  return out;
}

absl::StatusOr<Tensor> GPTModel::BackwardStep(
    const Tensor& output_grad, float grad_scale,
    std::unique_ptr<parallel::ActivationRecord> record) {
  auto* rec = dynamic_cast<ChunkRecord*>(record.get());
  if (rec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model chunk from layer ", chunk_.first_layer,
        ": backward needs the record of this chunk's ForwardStep"));
  }
  return ChunkBackward(output_grad, grad_scale, rec);
}

absl::StatusOr<Tensor> GPTModel::BackwardInputStep(
    const Tensor& output_grad, float grad_scale,
    std::unique_ptr<parallel::ActivationRecord>* record) {
  if (!UnitHooksAllowSplitBackward()) {
    return parallel::PipelineStage::BackwardInputStep(output_grad, grad_scale,
                                                      record);
  }
  auto* rec = dynamic_cast<ChunkRecord*>(record->get());
  if (rec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model chunk from layer ", chunk_.first_layer,
        ": backward needs the record of this chunk's ForwardStep"));
  }
  return ChunkBackward(output_grad, grad_scale, rec, &rec->weight_grads);
}

absl::Status GPTModel::BackwardWeightStep(
    std::unique_ptr<parallel::ActivationRecord> record) {
  // B ran the whole backward (hooks that do not allow the split).
  if (record == nullptr) return absl::OkStatus();
  auto* rec = dynamic_cast<ChunkRecord*>(record.get());
  if (rec == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model chunk from layer ", chunk_.first_layer,
                     ": the weight gradient needs the record of this chunk's "
                     "BackwardInputStep"));
  }
  return rec->weight_grads.Run();
}

absl::Status GPTModel::CheckBatch(const MicroBatch& batch) const {
  const Tensor& t = batch.tokens;
  if (t.dim() != 2 || t.dtype() != DType::kInt64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batch tokens ", t.Describe(), " must be int64 [batch, seq]"));
  }
  if (t.size(1) > config_.max_positions()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batch sequence length ", t.size(1),
        " exceeds the position table (", config_.max_positions(), ")"));
  }
  if (cp_size() > 1) {
    MCC_RETURN_IF_ERROR(context_parallel::ChunkLayout::Create(
                            cp_size(), GroupRank(context_.cp_group), t.size(1))
                            .status());
  }
  const int64_t local_s = t.size(1) / cp_size();
  if (context_.sequence_parallel && local_s % GroupSize(context_.tp_group)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence length ", t.size(1), cp_size() > 1 ? " / CP" : "",
        " is not divisible by the tensor-parallel size under SP"));
  }
  if (batch.labels.shape() != t.shape() ||
      batch.labels.dtype() != DType::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch labels ", batch.labels.Describe(),
                     " do not match tokens ", t.Describe()));
  }
  if (batch.loss_mask.defined() &&
      (batch.loss_mask.shape() != t.shape() ||
       batch.loss_mask.dtype() != DType::kFloat32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch loss mask ", batch.loss_mask.Describe(),
                     " must be fp32 shaped as tokens ", t.Describe()));
  }
  if (batch.position_ids.defined() &&
      (batch.position_ids.shape() != t.shape() ||
       batch.position_ids.dtype() != DType::kInt64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch position_ids ", batch.position_ids.Describe(),
                     " must be int64 shaped as tokens ", t.Describe()));
  }
  for (const Tensor* x :
       {&batch.tokens, &batch.labels, &batch.loss_mask, &batch.position_ids}) {
    if (x->defined() && x->device() != context_.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "micro-batch tensor ", x->Describe(),
          " is not on the model's device ", context_.device.ToString(),
          " (copy the batch there first)"));
    }
  }
  return absl::OkStatus();
}

namespace {

// [b, s] -> [s * b] in sequence-major order (int64 or fp32), on x's device.
absl::StatusOr<Tensor> SeqMajor(const Tensor& x) {
  const int64_t b = x.size(0), s = x.size(1);
  Tensor out = Tensor::Empty({s * b}, x.dtype(), x.device());
  MCC_ASSIGN_OR_RETURN(Tensor out2d, out.Reshape({s, b}));
  MCC_RETURN_IF_ERROR(ops::Permute(x, {1, 0}, &out2d));
  return out;
}

}  // namespace

absl::StatusOr<Tensor> GPTModel::SeqMajorPositions(int64_t b, int64_t s,
                                                   int64_t first) const {
  // Only learned position embeddings look positions up.
  if (position_embeddings_ == nullptr) return Tensor();
  if (first < 0 || first + s > position_ids_.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "positions [", first, ", ", first + s, ") exceed the position table (",
        position_ids_.numel(), " positions)"));
  }
  // positions[si * b + bi] = first + si: the table read with stride 0 over
  // the batch.
  Tensor positions = Tensor::Empty({s * b}, DType::kInt64, context_.device);
  ops::StridedCopyPlan plan;
  plan.rank = 2;
  plan.shape[0] = s;
  plan.shape[1] = b;
  plan.src_strides[0] = 1;
  plan.src_strides[1] = 0;
  plan.src_offset = first;
  plan.dst_strides[0] = b;
  plan.dst_strides[1] = 1;
  MCC_RETURN_IF_ERROR(ops::CopyStrided(position_ids_, plan, &positions));
  return positions;
}

absl::StatusOr<Tensor> GPTModel::Embed(const Tensor& ids,
                                       const Tensor& positions, uint64_t offset,
                                       bool dropout) const {
  MCC_ASSIGN_OR_RETURN(Tensor emb, word_embeddings_->Forward(ids));
  if (position_embeddings_ != nullptr) {
    Tensor pos = Tensor::Empty(emb.shape(), emb.dtype(), emb.device());
    MCC_RETURN_IF_ERROR(
        ops::EmbeddingLookup(positions, position_embeddings_->value, &pos));
    MCC_RETURN_IF_ERROR(ops::Add(emb, pos, &emb));
  }
  const float p = static_cast<float>(config_.hidden_dropout);
  if (dropout && p > 0) {
    MCC_RETURN_IF_ERROR(ops::Dropout(emb, p, config_.seed, offset, &emb));
  }
  const bool sp = context_.sequence_parallel;
  MCC_ASSIGN_OR_RETURN(Tensor x,
                       parallel::ScatterToSequenceParallelRegion::Forward(
                           sp ? context_.tp_group : nullptr, emb));
  if (sp) x = x.Clone();  // Own storage: the full embedding can be freed.
  return x;
}

int GPTModel::cp_size() const {
  return std::max(1, GroupSize(context_.cp_group));
}

absl::StatusOr<MicroBatch> GPTModel::ContextSlice(
    const MicroBatch& full) const {
  if (cp_size() == 1) return full;
  MCC_ASSIGN_OR_RETURN(auto layout, context_parallel::ChunkLayout::Create(
                                        cp_size(), GroupRank(context_.cp_group),
                                        full.tokens.size(1)));
  MicroBatch local;
  MCC_ASSIGN_OR_RETURN(local.tokens, layout.SliceSequence(full.tokens));
  MCC_ASSIGN_OR_RETURN(local.labels, layout.SliceSequence(full.labels));
  if (full.loss_mask.defined()) {
    MCC_ASSIGN_OR_RETURN(local.loss_mask, layout.SliceSequence(full.loss_mask));
  }
  if (full.position_ids.defined()) {
    MCC_ASSIGN_OR_RETURN(local.position_ids,
                         layout.SliceSequence(full.position_ids));
  }
  // Indexed by global position: the attention of every chunk reads it.
  local.document_start = full.document_start;
  return local;
}

absl::StatusOr<Tensor> GPTModel::LocalPositions(int64_t b, int64_t s) const {
  if (cp_size() == 1 || position_embeddings_ == nullptr) {
    return SeqMajorPositions(b, s, 0);
  }
  // Two chunks: rows [c * l * b, (c + 1) * l * b) hold chunk c's positions.
  const int64_t l = s / 2;
  Tensor positions = Tensor::Empty({s * b}, DType::kInt64, context_.device);
  for (int c = 0; c < 2; ++c) {
    const int64_t first = context_parallel::ChunkLayout::GlobalChunk(
                              cp_size(), GroupRank(context_.cp_group), c) *
                          l;
    MCC_ASSIGN_OR_RETURN(Tensor part, SeqMajorPositions(b, l, first));
    MCC_ASSIGN_OR_RETURN(Tensor rows,
                         positions.Slice(c * l * b, (c + 1) * l * b));
    MCC_RETURN_IF_ERROR(ops::Convert(part, &rows));
  }
  return positions;
}

uint64_t GPTModel::EmbeddingDropoutOffset(uint64_t call, int64_t b,
                                          int64_t s) const {
  // CP rank r's embeddings take the r-th S / C of the site's stretch.
  return DropoutOffset(call, config_.num_layers, b, s) +
         static_cast<uint64_t>(GroupRank(context_.cp_group)) *
             static_cast<uint64_t>(s * b * config_.hidden_size);
}

absl::Status GPTModel::CheckWholeModel(const char* what) const {
  if (chunk_.pre_process && chunk_.post_process) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what,
      " needs the whole model; this one holds a pipeline chunk (load "
      "the checkpoint with --pipeline-model-parallel-size 1)"));
}

absl::StatusOr<Tensor> GPTModel::LastTokenLogits(const Tensor& tokens) {
  if (cp_size() > 1) {
    return absl::FailedPreconditionError(
        "LastTokenLogits with context parallelism: build a model without it "
        "for generation");
  }
  MCC_RETURN_IF_ERROR(CheckWholeModel("generation"));
  MicroBatch batch;
  batch.tokens = tokens;
  batch.labels = tokens;
  MCC_RETURN_IF_ERROR(CheckBatch(batch));
  const int64_t b = tokens.size(0), s = tokens.size(1);
  MCC_ASSIGN_OR_RETURN(Tensor ids, SeqMajor(tokens));
  MCC_ASSIGN_OR_RETURN(Tensor positions, SeqMajorPositions(b, s, 0));
  MCC_ASSIGN_OR_RETURN(Tensor first_key,
                       AttentionFirstKeys(Tensor(), b, s, config_.window_left));
  // Evaluation runs without dropout.
  for (const auto& layer : layers_) layer->set_training(false);
  MCC_ASSIGN_OR_RETURN(Tensor x, Embed(ids, positions, 0, false));
  for (const auto& layer : layers_) {
    TransformerLayer::Activations act;
    act.first_key = first_key;
    MCC_ASSIGN_OR_RETURN(x, layer->Forward(x, b, 0, &act));
  }
  return LastPositionLogits(x, b, s);
}

absl::StatusOr<Tensor> GPTModel::LastPositionLogits(const Tensor& x, int64_t b,
                                                    int64_t s) const {
  comm::ProcessGroup* tp = context_.tp_group;
  Norm::Activations norm_act;
  MCC_ASSIGN_OR_RETURN(Tensor h, final_norm_->Forward(x, &norm_act));
  if (context_.sequence_parallel) {
    MCC_ASSIGN_OR_RETURN(h, parallel::GatherFirstDim(tp, h));
  }
  MCC_ASSIGN_OR_RETURN(Tensor last, h.Slice((s - 1) * b, s * b));
  // The output layer without its SP gather: `last` is already whole.
  const Tensor& w = output_layer_->weight()->value;
  Tensor logits = Tensor::Empty({b, w.size(0)}, DType::kFloat32, w.device());
  // Hidden states and weight share the model's dtype; the GEMM accumulates
  // in fp32 either way, so no copy of the vocabulary-sized weight is made.
  MCC_RETURN_IF_ERROR(ops::Gemm(last, false, w, true, &logits));
  MCC_ASSIGN_OR_RETURN(Tensor full, parallel::GatherLastDim(tp, logits));
  // Only the true vocabulary: a padded token can never be picked.
  const int64_t padded = full.size(1), vocab = config_.vocab_size;
  if (padded == vocab) return full;
  Tensor out = Tensor::Empty({b, vocab}, DType::kFloat32, full.device());
  ops::StridedCopyPlan plan;
  plan.rank = 2;
  plan.shape[0] = b;
  plan.shape[1] = vocab;
  plan.src_strides[0] = padded;
  plan.src_strides[1] = 1;
  plan.dst_strides[0] = vocab;
  plan.dst_strides[1] = 1;
  MCC_RETURN_IF_ERROR(ops::CopyStrided(full, plan, &out));
  return out;
}

absl::StatusOr<LossSum> GPTModel::ForwardBackward(const MicroBatch& batch,
                                                  float grad_scale) {
  return Run(batch, /*backward=*/true, grad_scale);
}

absl::StatusOr<LossSum> GPTModel::Forward(const MicroBatch& batch) {
  return Run(batch, /*backward=*/false, 0.0f);
}

absl::StatusOr<LossSum> GPTModel::Run(const MicroBatch& batch, bool backward,
                                      float grad_scale) {
  MCC_RETURN_IF_ERROR(
      CheckWholeModel("ForwardBackward (use a pipeline schedule's ForwardStep "
                      "/ BackwardStep)"));
  ChunkRecord record;
  MCC_RETURN_IF_ERROR(
      ChunkForward(batch, Tensor(), backward, &record).status());
  if (backward) {
    MCC_RETURN_IF_ERROR(ChunkBackward(Tensor(), grad_scale, &record).status());
  }
  // The host value this call returns: one device-to-host copy.
  return parallel::ReadLossSum(record.loss_sum);
}

uint64_t GPTModel::DropoutOffset(uint64_t call, int site_block, int64_t b,
                                 int64_t s) const {
  // Each forward call owns a disjoint stretch of the dropout stream: two
  // sites per layer plus the embedding's, numbered over the whole model so
  // that every pipeline split draws the serial model's masks.
  // s is this rank's share under CP; the stream is laid out by the whole
  // sequence's length.
  const uint64_t full_numel =
      static_cast<uint64_t>(s * cp_size() * b * config_.hidden_size);
  return (call * (config_.num_layers + 1) + site_block) * 2 * full_numel;
}

absl::Status GPTModel::LayerForward(int i, const Tensor& x,
                                    const ChunkRecord& rec,
                                    TransformerLayer::Activations* act,
                                    Tensor* out) {
  act->first_key = rec.first_key;
  MCC_ASSIGN_OR_RETURN(
      *out,
      layers_[i]->Forward(
          x, rec.b,
          DropoutOffset(rec.call, chunk_.first_layer + i, rec.b, rec.s), act));
  return absl::OkStatus();
}

absl::StatusOr<Tensor> GPTModel::ChunkForward(const MicroBatch& full_batch,
                                              const Tensor& input,
                                              bool backward_after,
                                              ChunkRecord* rec) {
  MCC_RETURN_IF_ERROR(CheckBatch(full_batch));
  // Under context parallelism this rank's two chunks of every sequence.
  MCC_ASSIGN_OR_RETURN(const MicroBatch batch, ContextSlice(full_batch));
  comm::ProcessGroup* tp = context_.tp_group;
  const int64_t b = batch.tokens.size(0), s = batch.tokens.size(1);
  const int num_layers = static_cast<int>(layers_.size());
  *rec = ChunkRecord();
  rec->b = b;
  rec->s = s;
  rec->call = forward_calls_++;
  MCC_ASSIGN_OR_RETURN(
      rec->first_key,
      AttentionFirstKeys(full_batch.document_start, b,
                         full_batch.tokens.size(1), config_.window_left));
  // Dropout only while training; a forward without backward is evaluation.
  for (const auto& layer : layers_) layer->set_training(backward_after);

  Tensor x;
  if (chunk_.pre_process) {
    // Embeddings, in sequence-major order.
    MCC_ASSIGN_OR_RETURN(Tensor ids, SeqMajor(batch.tokens));
    Tensor positions;
    if (batch.position_ids.defined() && position_embeddings_ != nullptr) {
      MCC_ASSIGN_OR_RETURN(positions, SeqMajor(batch.position_ids));
    } else {
      MCC_ASSIGN_OR_RETURN(positions, LocalPositions(b, s));
    }
    MCC_RETURN_IF_ERROR(CallBeforeForward(embedding_unit_));
    MCC_ASSIGN_OR_RETURN(
        x, Embed(ids, positions, EmbeddingDropoutOffset(rec->call, b, s),
                 backward_after));
    MCC_RETURN_IF_ERROR(CallAfterForward(embedding_unit_));
    if (backward_after) {
      rec->ids = ids;
      rec->positions = positions;
    }
  } else {
    if (input.shape() != HiddenShape(b, s) || input.dtype() != context_.dtype ||
        input.device() != context_.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model chunk from layer ", chunk_.first_layer, ": input ",
          input.Describe(), " is not the previous stage's hidden states ",
          ShapeToString(HiddenShape(b, s)), " ", DTypeName(context_.dtype),
          " on ", context_.device.ToString()));
    }
    x = input;
  }

  // Which layers start a recomputed chunk, and how long it is.
  rec->chunk_len.assign(num_layers, 0);
  if (config_.recompute_granularity == RecomputeGranularity::kFull) {
    const int n = config_.recompute_num_layers;
    if (config_.recompute_method == RecomputeMethod::kUniform) {
      for (int i = 0; i < num_layers; i += n) {
        rec->chunk_len[i] = std::min(n, num_layers - i);
      }
    } else {
      for (int i = 0; i < std::min(n, num_layers); ++i) rec->chunk_len[i] = 1;
    }
  }
  rec->layers.assign(num_layers, TransformerLayer::Activations());
  rec->chunk_inputs.assign(num_layers, Tensor());
  // --cpu-offloading: what the first layers save goes to host memory as
  // soon as each has run (the copies overlap the next layer's forward).
  const bool offload = backward_after && offloader_ != nullptr;
  if (offload) rec->offloaded.resize(num_layers);
  for (int i = 0; i < num_layers;) {
    const int first = i;
    if (rec->chunk_len[i] > 0 && backward_after) {
      // Keep only the chunk's input; its records are rebuilt in backward.
      rec->chunk_inputs[i] = x;
      for (int j = i; j < i + rec->chunk_len[i]; ++j) {
        TransformerLayer::Activations scratch;
        MCC_RETURN_IF_ERROR(CallBeforeForward(first_layer_unit_ + j));
        MCC_RETURN_IF_ERROR(LayerForward(j, x, *rec, &scratch, &x));
        MCC_RETURN_IF_ERROR(RecordMoe(j, scratch));
        MCC_RETURN_IF_ERROR(CallAfterForward(first_layer_unit_ + j));
      }
      i += rec->chunk_len[i];
    } else {
      MCC_RETURN_IF_ERROR(CallBeforeForward(first_layer_unit_ + i));
      MCC_RETURN_IF_ERROR(LayerForward(i, x, *rec, &rec->layers[i], &x));
      MCC_RETURN_IF_ERROR(CallAfterForward(first_layer_unit_ + i));
      if (backward_after) MCC_RETURN_IF_ERROR(RecordMoe(i, rec->layers[i]));
      if (!backward_after) rec->layers[i] = TransformerLayer::Activations();
      ++i;
    }
    if (offload && first < offload_layers_) {
      // Also releases the layer before, whose copies this one's forward
      // covered.
      MCC_ASSIGN_OR_RETURN(rec->offloaded[first],
                           offloader_->Offload(OffloadSlots(rec, first)));
    } else if (offload) {
      MCC_RETURN_IF_ERROR(offloader_->ReleaseOffloaded());
    }
  }
  if (offload) {
    // The last copies end before the head's peak.
    MCC_RETURN_IF_ERROR(offloader_->ReleaseOffloaded());
    if (!offload_logged_) {
      offload_logged_ = true;
      int64_t bytes = 0;
      for (const auto& g : rec->offloaded) {
        if (g != nullptr) bytes += g->bytes();
      }
      LOG(INFO) << "--cpu-offloading: the first " << offload_layers_ << " of "
                << num_layers << " layers of the model chunk from layer "
                << chunk_.first_layer << " move " << FormatBytes(bytes)
                << " of activations per micro-batch to pinned host memory ("
                << (offloader_->asynchronous()
                        ? "on a side stream"
                        : "synchronous copies: the device has no side stream")
                << ", " << context_.device.ToString() << ")";
    }
  }
  if (!chunk_.post_process) {
    rec->pending = backward_after;
    return x;
  }

  // Head: final norm, output layer (tied: the embedding unit's weight) and
  // the loss.
  const bool tied_here =
      !config_.untie_embeddings_and_output_weights && chunk_.pre_process;
  MCC_RETURN_IF_ERROR(CallBeforeForward(head_unit_));
  MCC_ASSIGN_OR_RETURN(Tensor final_out,
                       final_norm_->Forward(x, &rec->final_act));
  x = Tensor();
  if (tied_here) {
    MCC_RETURN_IF_ERROR(CallBeforeForward(embedding_unit_));
  }
  MCC_ASSIGN_OR_RETURN(Tensor logits,
                       output_layer_->Forward(final_out, &rec->head_act));
  if (tied_here) {
    MCC_RETURN_IF_ERROR(CallAfterForward(embedding_unit_));
  }
  MCC_RETURN_IF_ERROR(CallAfterForward(head_unit_));
  MCC_ASSIGN_OR_RETURN(Tensor labels, SeqMajor(batch.labels));
  MCC_ASSIGN_OR_RETURN(
      Tensor losses,
      parallel::VocabParallelCrossEntropy::Forward(
          tp, logits, labels, vocab_start_, config_.vocab_size, &rec->ce_act));
  logits = Tensor();
  Tensor mask;  // Undefined: every token weighs 1.
  if (batch.loss_mask.defined()) {
    MCC_ASSIGN_OR_RETURN(mask, SeqMajor(batch.loss_mask));
  }
  // The loss stays on the device; callers read it when they need it.
  Tensor loss_sum = Tensor::Empty({4}, DType::kFloat32, losses.device());
  MCC_RETURN_IF_ERROR(ops::LossSum(losses, mask, labels,
                                   rec->ce_act.ignore_index,
                                   /*accumulate=*/false, &loss_sum));
  if (cp_size() > 1) {
    // Every CP rank holds the whole micro-batch's loss sum and token count:
    // each normalises its share by all the sequence's tokens.
    MCC_RETURN_IF_ERROR(
        context_.cp_group->AllReduceSync(&loss_sum, comm::ReduceOp::kSum));
  }
  if (backward_after) {
    rec->mask = mask;
    rec->pending = true;
  } else {
    *rec = ChunkRecord();
  }
  rec->loss_sum = loss_sum;
  return Tensor();
}

absl::StatusOr<Tensor> GPTModel::ChunkBackward(
    const Tensor& output_grad, float grad_scale, ChunkRecord* rec,
    parallel::DeferredWeightGrads* deferred) {
  // A unit's gradients are complete, and its hooks run, once its weight
  // gradients have accumulated: now, or in W.
  const auto unit_done = [this, deferred](int unit) -> absl::Status {
    auto done = [this, unit]() -> absl::Status {
      MCC_RETURN_IF_ERROR(CallAfterBackward(unit));
      return CallGradsReady(units_[unit]);
    };
    if (deferred == nullptr) return done();
    deferred->Add(std::move(done));
    return absl::OkStatus();
  };
  if (!rec->pending) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model chunk from layer ", chunk_.first_layer,
        ": backward without a pending forward (was it run for evaluation?)"));
  }
  const int64_t b = rec->b, s = rec->s;
  const int num_layers = static_cast<int>(layers_.size());
  // The head opens the embedding's unit only where both are in this chunk;
  // the first stage of a tied pipeline opens it itself below.
  const bool tied_here = !config_.untie_embeddings_and_output_weights &&
                         chunk_.pre_process && chunk_.post_process;
  Tensor dx;
  if (chunk_.post_process) {
    Tensor dloss = Tensor::Empty({s * b}, DType::kFloat32, context_.device);
    MCC_RETURN_IF_ERROR(
        // Times C: data parallelism averages the gradients over DP x CP,
        // where the CP ranks' shares must add up (Megatron scales so too).
        ops::LossSumGradient(rec->loss_sum, rec->mask,
                             grad_scale * static_cast<float>(cp_size()),
                             &dloss));
    MCC_ASSIGN_OR_RETURN(Tensor dlogits,
                         parallel::VocabParallelCrossEntropy::Backward(
                             dloss, rec->ce_act, context_.dtype));
    rec->ce_act = {};
    MCC_RETURN_IF_ERROR(CallBeforeBackward(head_unit_));
    // The tied weight's unit stays open until the embeddings' backward.
    if (tied_here) {
      MCC_RETURN_IF_ERROR(CallBeforeBackward(embedding_unit_));
    }
    MCC_ASSIGN_OR_RETURN(Tensor dfinal, output_layer_->Backward(
                                            dlogits, rec->head_act, deferred));
    rec->head_act = {};
    dlogits = Tensor();
    MCC_ASSIGN_OR_RETURN(dx, final_norm_->Backward(dfinal, rec->final_act));
    rec->final_act = {};
    MCC_RETURN_IF_ERROR(unit_done(head_unit_));
  } else {
    if (output_grad.shape() != HiddenShape(b, s) ||
        output_grad.dtype() != context_.dtype ||
        output_grad.device() != context_.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model chunk from layer ", chunk_.first_layer, ": output gradient ",
          output_grad.Describe(), " is not the hidden states' ",
          ShapeToString(HiddenShape(b, s)), " ", DTypeName(context_.dtype),
          " on ", context_.device.ToString()));
    }
    dx = output_grad;
  }
  const std::vector<int>& chunk_len = rec->chunk_len;
  // The first layer of the backward step that holds layer i: the start of
  // its recomputed chunk, or i itself.
  const auto step_start = [&chunk_len](int i) {
    int start = i;
    for (int j = 0; j <= i; ++j) {
      if (chunk_len[j] > 0 && j + chunk_len[j] - 1 >= i) start = j;
    }
    return start;
  };
  for (int i = num_layers - 1; i >= 0;) {
    // The recomputed chunk that holds layer i, if any.
    const int start = step_start(i);
    const bool recomputed = start < i || chunk_len[i] > 0;
    for (int j = start; j <= i; ++j) {
      MCC_RETURN_IF_ERROR(CallBeforeBackward(first_layer_unit_ + j));
    }
    if (!rec->offloaded.empty()) {
      // This step's activations come back (the current stream waits for
      // them); the next offloaded step's start coming back overlaps it.
      for (int j = start; j <= i; ++j) {
        if (rec->offloaded[j] == nullptr) continue;
        MCC_RETURN_IF_ERROR(
            offloader_->Restore(rec->offloaded[j].get(), OffloadSlots(rec, j)));
        rec->offloaded[j].reset();
      }
      const int next = start > 0 ? step_start(start - 1) : -1;
      if (next >= 0 && rec->offloaded[next] != nullptr) {
        MCC_RETURN_IF_ERROR(offloader_->Prefetch(rec->offloaded[next].get()));
      }
    }
    if (recomputed) {
      Tensor y = rec->chunk_inputs[start];
      for (int j = start; j <= i; ++j) {
        MCC_RETURN_IF_ERROR(LayerForward(j, y, *rec, &rec->layers[j], &y));
      }
      rec->chunk_inputs[start] = Tensor();
    }
    for (int j = i; j >= start; --j) {
      // The balancing losses' gradients scale as the LM loss's.
      MCC_ASSIGN_OR_RETURN(
          dx, layers_[j]->Backward(dx, b, &rec->layers[j],
                                   grad_scale * static_cast<float>(cp_size()),
                                   deferred));
      rec->layers[j] = TransformerLayer::Activations();
      MCC_RETURN_IF_ERROR(unit_done(first_layer_unit_ + j));
    }
    i = start - 1;
  }
  rec->pending = false;
  if (!chunk_.pre_process) return dx;

  comm::ProcessGroup* tp = context_.tp_group;
  const bool sp = context_.sequence_parallel;
  if (!tied_here) {
    MCC_RETURN_IF_ERROR(CallBeforeBackward(embedding_unit_));
  }
  MCC_ASSIGN_OR_RETURN(Tensor demb,
                       parallel::ScatterToSequenceParallelRegion::Backward(
                           sp ? tp : nullptr, dx));
  dx = Tensor();
  const float p = static_cast<float>(config_.hidden_dropout);
  if (p > 0) {
    Tensor d = Tensor::Empty(demb.shape(), demb.dtype(), demb.device());
    MCC_RETURN_IF_ERROR(ops::DropoutBackward(
        demb, p, config_.seed, EmbeddingDropoutOffset(rec->call, b, s), &d));
    demb = d;
  }
  // The embeddings' gradients are weight gradients too (and a tied word
  // embedding's must follow the output layer's, deferred above).
  auto embedding_grads = [this, ids = rec->ids, positions = rec->positions,
                          demb]() -> absl::Status {
    MCC_RETURN_IF_ERROR(word_embeddings_->Backward(ids, demb));
    if (position_embeddings_ != nullptr) {
      MCC_RETURN_IF_ERROR(ops::EmbeddingBackward(
          positions, demb, &position_embeddings_->main_grad));
    }
    return absl::OkStatus();
  };
  if (deferred != nullptr) {
    deferred->Add(std::move(embedding_grads));
  } else {
    MCC_RETURN_IF_ERROR(embedding_grads());
  }
  const Tensor loss_sum = rec->loss_sum;
  parallel::DeferredWeightGrads weight_grads = std::move(rec->weight_grads);
  *rec = ChunkRecord();
  rec->loss_sum = loss_sum;
  rec->weight_grads = std::move(weight_grads);
  MCC_RETURN_IF_ERROR(unit_done(embedding_unit_));
  return Tensor();
}

absl::Status GPTModel::RecordMoe(int local_layer,
                                 const TransformerLayer::Activations& act) {
  if (layers_[local_layer]->moe() == nullptr) return absl::OkStatus();
  for (MoeAccumulator& acc : moe_) {
    if (acc.local_layer != local_layer) continue;
    const std::vector<int64_t>& counts = act.moe.tokens_per_expert;
    for (size_t e = 0; e < counts.size() && e < acc.log_tokens.size(); ++e) {
      acc.log_tokens[e] += counts[e];
      acc.bias_tokens[e] += counts[e];
    }
    if (act.moe.aux_loss.defined()) {
      MCC_RETURN_IF_ERROR(
          ops::Add(acc.aux_sum, act.moe.aux_loss, &acc.aux_sum));
    }
    if (act.moe.z_loss.defined()) {
      MCC_RETURN_IF_ERROR(ops::Add(acc.z_sum, act.moe.z_loss, &acc.z_sum));
    }
    ++acc.micro_batches;
  }
  return absl::OkStatus();
}

std::vector<comm::ProcessGroup*> GPTModel::SequenceShardGroups() const {
  std::vector<comm::ProcessGroup*> groups;
  if (cp_size() > 1) groups.push_back(context_.cp_group);
  if (context_.sequence_parallel && GroupSize(context_.tp_group) > 1) {
    groups.push_back(context_.tp_group);
  }
  return groups;
}

absl::Status GPTModel::SumOverSequenceShards(Tensor* t) const {
  for (comm::ProcessGroup* g : SequenceShardGroups()) {
    MCC_RETURN_IF_ERROR(g->AllReduceSync(t, comm::ReduceOp::kSum));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> GPTModel::SumOverSequenceShards(
    std::vector<int64_t> counts) const {
  if (SequenceShardGroups().empty()) return counts;
  MCC_ASSIGN_OR_RETURN(
      Tensor t,
      Tensor::FromInts(counts, {static_cast<int64_t>(counts.size())}));
  MCC_ASSIGN_OR_RETURN(t, t.To(context_.device));
  MCC_RETURN_IF_ERROR(SumOverSequenceShards(&t));
  MCC_ASSIGN_OR_RETURN(t, t.To(Device::CPU()));
  counts.assign(t.data<int64_t>(), t.data<int64_t>() + counts.size());
  return counts;
}

absl::StatusOr<std::vector<MoeLayerStats>> GPTModel::TakeMoeStats() {
  std::vector<MoeLayerStats> out;
  for (MoeAccumulator& acc : moe_) {
    MoeLayerStats st;
    st.layer = acc.layer;
    // The CP (and SP) ranks' counts and loss shares add up to the whole
    // sequences'.
    MCC_ASSIGN_OR_RETURN(st.tokens_per_expert,
                         SumOverSequenceShards(acc.log_tokens));
    st.micro_batches = acc.micro_batches;
    MCC_RETURN_IF_ERROR(SumOverSequenceShards(&acc.aux_sum));
    MCC_RETURN_IF_ERROR(SumOverSequenceShards(&acc.z_sum));
    MCC_ASSIGN_OR_RETURN(Tensor aux, acc.aux_sum.To(Device::CPU()));
    MCC_ASSIGN_OR_RETURN(Tensor z, acc.z_sum.To(Device::CPU()));
    st.aux_loss_sum = aux.data<float>()[0];
    st.z_loss_sum = z.data<float>()[0];
    out.push_back(std::move(st));
    acc.log_tokens.assign(acc.log_tokens.size(), 0);
    acc.micro_batches = 0;
    acc.aux_sum = Tensor::Zeros({1}, DType::kFloat32, context_.device);
    acc.z_sum = Tensor::Zeros({1}, DType::kFloat32, context_.device);
  }
  return out;
}

absl::Status GPTModel::UpdateExpertBias(comm::ProcessGroup* dp_group) {
  for (MoeAccumulator& acc : moe_) {
    moe::MoeMlp* moe = layers_[acc.local_layer]->moe();
    if (!moe->expert_bias().defined()) continue;
    MCC_ASSIGN_OR_RETURN(std::vector<int64_t> counts,
                         SumOverSequenceShards(acc.bias_tokens));
    acc.bias_tokens.assign(counts.size(), 0);
    if (dp_group != nullptr && dp_group->size() > 1) {
      // Every data-parallel replica steps its bias by the global load.
      MCC_ASSIGN_OR_RETURN(
          Tensor t,
          Tensor::FromInts(counts, {static_cast<int64_t>(counts.size())}));
      MCC_ASSIGN_OR_RETURN(t, t.To(context_.device));
      MCC_RETURN_IF_ERROR(dp_group->AllReduceSync(&t, comm::ReduceOp::kSum));
      MCC_ASSIGN_OR_RETURN(t, t.To(Device::CPU()));
      counts.assign(t.data<int64_t>(), t.data<int64_t>() + counts.size());
    }
    MCC_RETURN_IF_ERROR(moe->UpdateExpertBias(
        counts, static_cast<float>(config_.moe_router_bias_update_rate)));
  }
  return absl::OkStatus();
}

std::vector<Tensor*> GPTModel::OffloadSlots(ChunkRecord* rec, int i) {
  if (rec->chunk_len[i] > 0) return {&rec->chunk_inputs[i]};
  return rec->layers[i].Tensors();
}

OffloadStats GPTModel::offload_stats() const {
  return offloader_ == nullptr ? OffloadStats() : offloader_->stats();
}

}  // namespace gpt
}  // namespace mcc
