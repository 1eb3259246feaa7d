#include "models/gpt/gpt_model.h"

#include "absl/strings/str_cat.h"
#include "core/ops/dropout.h"
#include "core/ops/embedding.h"
#include "core/ops/gemm.h"
#include "core/status_macros.h"
#include "models/gpt/residual.h"
#include "parallel/mappings.h"

namespace mcc {
namespace gpt {

using parallel::GroupRank;
using parallel::GroupSize;
using parallel::InitSpec;

absl::StatusOr<std::unique_ptr<GPTModel>> GPTModel::Create(
    const GPTConfig& config, const parallel::LayerContext& context) {
  MCC_RETURN_IF_ERROR(
      config.Validate(GroupSize(context.tp_group), context.sequence_parallel));
  auto model = std::unique_ptr<GPTModel>(new GPTModel);
  model->config_ = config;
  model->context_ = context;
  const auto init =
      InitSpec::Normal(static_cast<float>(config.init_method_std));
  MCC_ASSIGN_OR_RETURN(
      model->word_embeddings_,
      parallel::VocabParallelEmbedding::Create(
          "embedding.word_embeddings.weight", config.vocab_size,
          config.hidden_size, init, context));
  model->parameters_.push_back(model->word_embeddings_->weight());
  if (config.position_embedding == PositionEmbedding::kLearned) {
    MCC_ASSIGN_OR_RETURN(
        model->position_embeddings_,
        parallel::MakeParameter("embedding.position_embeddings.weight",
                                {config.max_positions(), config.hidden_size},
                                -1, init, context, /*weight_decay=*/true));
    model->parameters_.push_back(model->position_embeddings_);
  }
  for (int i = 0; i < config.num_layers; ++i) {
    MCC_ASSIGN_OR_RETURN(auto layer,
                         TransformerLayer::Create(i, config, context));
    layer->AppendParameters(&model->parameters_);
    model->layers_.push_back(std::move(layer));
  }
  MCC_ASSIGN_OR_RETURN(
      model->final_norm_,
      Norm::Create("decoder.final_layernorm", config, context));
  model->final_norm_->AppendParameters(&model->parameters_);
  if (config.untie_embeddings_and_output_weights) {
    parallel::LinearOptions options;
    options.bias = false;
    options.weight_init = init;
    MCC_ASSIGN_OR_RETURN(model->output_layer_,
                         parallel::ColumnParallelLinear::Create(
                             "output_layer", config.hidden_size,
                             config.vocab_size, options, context));
    model->output_layer_->AppendParameters(&model->parameters_);
  } else {
    MCC_ASSIGN_OR_RETURN(
        model->output_layer_,
        parallel::ColumnParallelLinear::CreateTied(
            "output_layer", model->word_embeddings_->weight(), context));
  }
  return model;
}

void GPTModel::ZeroGradients() {
  for (const auto& p : parameters_) p->main_grad.Zero();
}

absl::Status GPTModel::FinalizeGradients() {
  if (GroupSize(context_.tp_group) == 1) return absl::OkStatus();
  for (const auto& p : parameters_) {
    if (p->sequence_parallel) {
      MCC_RETURN_IF_ERROR(context_.tp_group->AllReduceSync(
          &p->main_grad, comm::ReduceOp::kSum));
    }
  }
  return absl::OkStatus();
}

absl::Status GPTModel::GradsReady(const ParameterList& params) const {
  if (!grad_ready_hook_) return absl::OkStatus();
  std::vector<Parameter*> ready;
  for (const auto& p : params) ready.push_back(p.get());
  return grad_ready_hook_(ready);
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
  if (context_.sequence_parallel && t.size(1) % GroupSize(context_.tp_group)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence length ", t.size(1),
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
  return absl::OkStatus();
}

namespace {

// [b, s] -> [s * b] in sequence-major order (int64 or fp32).
template <typename T>
Tensor SeqMajor(const Tensor& x) {
  const int64_t b = x.size(0), s = x.size(1);
  Tensor out = Tensor::Empty({s * b}, x.dtype());
  const T* src = x.data<T>();
  T* dst = out.data<T>();
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t si = 0; si < s; ++si) dst[si * b + bi] = src[bi * s + si];
  }
  return out;
}

// Positions first, first + 1, ... of b sequences of length s, in the same
// sequence-major order.
Tensor SeqMajorPositions(int64_t b, int64_t s, int64_t first) {
  Tensor positions = Tensor::Empty({s * b}, DType::kInt64);
  int64_t* p = positions.data<int64_t>();
  for (int64_t si = 0; si < s; ++si) {
    for (int64_t bi = 0; bi < b; ++bi) p[si * b + bi] = first + si;
  }
  return positions;
}

}  // namespace

absl::StatusOr<Tensor> GPTModel::Embed(const Tensor& ids,
                                       const Tensor& positions, uint64_t offset,
                                       bool dropout) const {
  MCC_ASSIGN_OR_RETURN(Tensor emb, word_embeddings_->Forward(ids));
  if (position_embeddings_ != nullptr) {
    Tensor pos = Tensor::Empty(emb.shape(), emb.dtype());
    MCC_RETURN_IF_ERROR(
        ops::EmbeddingLookup(positions, position_embeddings_->value, &pos));
    MCC_RETURN_IF_ERROR(AddResidual(emb, pos, &emb));
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

absl::StatusOr<Tensor> GPTModel::LastTokenLogits(const Tensor& tokens) {
  MicroBatch batch;
  batch.tokens = tokens;
  batch.labels = tokens;
  MCC_RETURN_IF_ERROR(CheckBatch(batch));
  const int64_t b = tokens.size(0), s = tokens.size(1);
  Tensor ids = SeqMajor<int64_t>(tokens);
  Tensor positions = SeqMajorPositions(b, s, 0);
  // Evaluation runs without dropout.
  for (const auto& layer : layers_) layer->set_training(false);
  MCC_ASSIGN_OR_RETURN(Tensor x, Embed(ids, positions, 0, false));
  for (const auto& layer : layers_) {
    TransformerLayer::Activations act;
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
  Tensor logits = Tensor::Empty({b, w.size(0)}, DType::kFloat32);
  // Hidden states and weight share the model's dtype; the GEMM accumulates
  // in fp32 either way, so no copy of the vocabulary-sized weight is made.
  MCC_RETURN_IF_ERROR(ops::Gemm(last, false, w, true, &logits));
  return parallel::GatherLastDim(tp, logits);
}

absl::StatusOr<KvCache> GPTModel::NewKvCache(int64_t batch,
                                             int64_t capacity) const {
  if (batch <= 0 || capacity <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: batch ", batch,
                                                   " and capacity ", capacity,
                                                   " must be positive"));
  }
  if (config_.position_embedding == PositionEmbedding::kLearned &&
      capacity > config_.max_positions()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache capacity ", capacity, " exceeds the position table (",
        config_.max_positions(), " positions)"));
  }
  const int64_t groups = config_.query_groups() / GroupSize(context_.tp_group);
  KvCache cache;
  cache.batch = batch;
  cache.capacity = capacity;
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerKvCache layer;
    layer.k = Tensor::Zeros({batch, capacity, groups, config_.head_dim()},
                            DType::kFloat32);
    layer.v = Tensor::Zeros(layer.k.shape(), DType::kFloat32);
    cache.layers.push_back(std::move(layer));
  }
  return cache;
}

absl::StatusOr<Tensor> GPTModel::Extend(const Tensor& tokens, KvCache* cache) {
  if (context_.sequence_parallel && GroupSize(context_.tp_group) > 1) {
    return absl::FailedPreconditionError(
        "KV-cache decoding needs a model built without sequence parallelism "
        "(one new token cannot be split along the sequence); the weights are "
        "the same, so build the decoding model with sequence_parallel=false");
  }
  if (tokens.dim() != 2 || tokens.dtype() != DType::kInt64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decoding tokens ", tokens.Describe(), " must be int64 [batch, seq]"));
  }
  const int64_t b = tokens.size(0), n = tokens.size(1);
  const int64_t p0 = cache->length;
  if (b != cache->batch || p0 + n > cache->capacity ||
      cache->layers.size() != layers_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decoding tokens ", tokens.Describe(), " at position ", p0,
        " do not fit a KV cache of batch ", cache->batch, ", capacity ",
        cache->capacity, " and ", cache->layers.size(),
        " layers (model: ", layers_.size(), ")"));
  }
  const int64_t* tp = tokens.data<int64_t>();
  for (int64_t i = 0; i < b * n; ++i) {
    if (tp[i] < 0 || tp[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decoding token ", tp[i], " is outside the vocabulary [0, ",
          config_.vocab_size, ")"));
    }
  }
  Tensor ids = SeqMajor<int64_t>(tokens);
  Tensor positions = SeqMajorPositions(b, n, p0);
  for (const auto& layer : layers_) layer->set_training(false);
  MCC_ASSIGN_OR_RETURN(Tensor x, Embed(ids, positions, 0, false));
  for (size_t i = 0; i < layers_.size(); ++i) {
    TransformerLayer::Activations act;
    MCC_ASSIGN_OR_RETURN(
        x, layers_[i]->Forward(x, b, 0, &act, &cache->layers[i], p0));
  }
  cache->length = p0 + n;
  return LastPositionLogits(x, b, n);
}

absl::StatusOr<Tensor> GPTModel::Prefill(const Tensor& tokens, KvCache* cache) {
  cache->length = 0;
  return Extend(tokens, cache);
}

absl::StatusOr<Tensor> GPTModel::DecodeStep(const Tensor& next_tokens,
                                            KvCache* cache) {
  if (next_tokens.dim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("decode step tokens ",
                                                   next_tokens.Describe(),
                                                   " must be int64 [batch]"));
  }
  MCC_ASSIGN_OR_RETURN(Tensor column,
                       next_tokens.Reshape({next_tokens.size(0), 1}));
  return Extend(column, cache);
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
  MCC_RETURN_IF_ERROR(CheckBatch(batch));
  comm::ProcessGroup* tp = context_.tp_group;
  const bool sp = context_.sequence_parallel;
  const int64_t b = batch.tokens.size(0), s = batch.tokens.size(1);
  const int64_t h = config_.hidden_size;
  const int num_layers = static_cast<int>(layers_.size());
  const uint64_t full_numel = static_cast<uint64_t>(s * b * h);
  // Each forward call owns a disjoint stretch of the dropout stream: two
  // sites per layer plus the embedding's.
  const uint64_t call = forward_calls_++;
  auto offset_of = [&](int site_block) {
    return (call * (num_layers + 1) + site_block) * 2 * full_numel;
  };

  // Embeddings, in sequence-major order.
  Tensor ids = SeqMajor<int64_t>(batch.tokens);
  Tensor positions = SeqMajorPositions(b, s, 0);
  const float p = static_cast<float>(config_.hidden_dropout);
  const uint64_t emb_offset = offset_of(num_layers);
  // Dropout only while training; Forward() alone is evaluation.
  for (const auto& layer : layers_) layer->set_training(backward);
  MCC_ASSIGN_OR_RETURN(Tensor x, Embed(ids, positions, emb_offset, backward));

  // Which layers start a recomputed chunk, and how long it is.
  std::vector<int> chunk_len(num_layers, 0);
  if (config_.recompute_granularity == RecomputeGranularity::kFull) {
    const int n = config_.recompute_num_layers;
    if (config_.recompute_method == RecomputeMethod::kUniform) {
      for (int i = 0; i < num_layers; i += n) {
        chunk_len[i] = std::min(n, num_layers - i);
      }
    } else {
      for (int i = 0; i < std::min(n, num_layers); ++i) chunk_len[i] = 1;
    }
  }
  std::vector<TransformerLayer::Activations> records(num_layers);
  std::vector<Tensor> chunk_inputs(num_layers);
  for (int i = 0; i < num_layers;) {
    if (chunk_len[i] > 0 && backward) {
      // Keep only the chunk's input; its records are rebuilt in backward.
      chunk_inputs[i] = x;
      for (int j = i; j < i + chunk_len[i]; ++j) {
        TransformerLayer::Activations scratch;
        MCC_ASSIGN_OR_RETURN(x,
                             layers_[j]->Forward(x, b, offset_of(j), &scratch));
      }
      i += chunk_len[i];
    } else {
      MCC_ASSIGN_OR_RETURN(
          x, layers_[i]->Forward(x, b, offset_of(i), &records[i]));
      if (!backward) records[i] = TransformerLayer::Activations();
      ++i;
    }
  }
  Norm::Activations final_act;
  MCC_ASSIGN_OR_RETURN(Tensor final_out, final_norm_->Forward(x, &final_act));
  parallel::ColumnParallelLinear::Activations head_act;
  MCC_ASSIGN_OR_RETURN(Tensor logits,
                       output_layer_->Forward(final_out, &head_act));
  Tensor labels = SeqMajor<int64_t>(batch.labels);
  parallel::VocabParallelCrossEntropy::Activations ce_act;
  MCC_ASSIGN_OR_RETURN(Tensor losses,
                       parallel::VocabParallelCrossEntropy::Forward(
                           tp, logits, labels, word_embeddings_->vocab_start(),
                           config_.vocab_size, &ce_act));
  logits = Tensor();
  Tensor mask;
  if (batch.loss_mask.defined()) {
    mask = SeqMajor<float>(batch.loss_mask);
  } else {
    mask = Tensor::Full({s * b}, 1.0, DType::kFloat32);
  }
  LossSum result;
  const float* lp = losses.data<float>();
  const float* mp = mask.data<float>();
  const int64_t* yp = labels.data<int64_t>();
  for (int64_t t = 0; t < s * b; ++t) {
    if (yp[t] == -100) continue;
    result.sum += static_cast<double>(lp[t]) * mp[t];
    result.tokens += mp[t];
  }
  if (!backward) return result;

  // Backward.
  Tensor dloss = Tensor::Empty({s * b}, DType::kFloat32);
  const float scale =
      result.tokens > 0 ? grad_scale / static_cast<float>(result.tokens) : 0.0f;
  for (int64_t t = 0; t < s * b; ++t) dloss.data<float>()[t] = mp[t] * scale;
  MCC_ASSIGN_OR_RETURN(
      Tensor dlogits,
      parallel::VocabParallelCrossEntropy::Backward(
          dloss, ce_act, word_embeddings_->vocab_start(), context_.dtype));
  ce_act = {};
  MCC_ASSIGN_OR_RETURN(Tensor dfinal,
                       output_layer_->Backward(dlogits, head_act));
  dlogits = Tensor();
  if (config_.untie_embeddings_and_output_weights) {
    ParameterList head;
    output_layer_->AppendParameters(&head);
    MCC_RETURN_IF_ERROR(GradsReady(head));
  }
  MCC_ASSIGN_OR_RETURN(Tensor dx, final_norm_->Backward(dfinal, final_act));
  {
    ParameterList norm;
    final_norm_->AppendParameters(&norm);
    MCC_RETURN_IF_ERROR(GradsReady(norm));
  }
  for (int i = num_layers - 1; i >= 0;) {
    // The recomputed chunk that holds layer i, if any.
    int start = i;
    for (int j = 0; j <= i; ++j) {
      if (chunk_len[j] > 0 && j + chunk_len[j] - 1 >= i) start = j;
    }
    if (chunk_len[start] > 0 && start + chunk_len[start] - 1 >= i) {
      Tensor y = chunk_inputs[start];
      for (int j = start; j <= i; ++j) {
        MCC_ASSIGN_OR_RETURN(
            y, layers_[j]->Forward(y, b, offset_of(j), &records[j]));
      }
      for (int j = i; j >= start; --j) {
        MCC_ASSIGN_OR_RETURN(dx, layers_[j]->Backward(dx, b, &records[j]));
        records[j] = TransformerLayer::Activations();
        ParameterList done;
        layers_[j]->AppendParameters(&done);
        MCC_RETURN_IF_ERROR(GradsReady(done));
      }
      chunk_inputs[start] = Tensor();
      i = start - 1;
    } else {
      MCC_ASSIGN_OR_RETURN(dx, layers_[i]->Backward(dx, b, &records[i]));
      records[i] = TransformerLayer::Activations();
      ParameterList done;
      layers_[i]->AppendParameters(&done);
      MCC_RETURN_IF_ERROR(GradsReady(done));
      --i;
    }
  }
  MCC_ASSIGN_OR_RETURN(Tensor demb,
                       parallel::ScatterToSequenceParallelRegion::Backward(
                           sp ? tp : nullptr, dx));
  if (p > 0 && backward) {
    Tensor d = Tensor::Empty(demb.shape(), demb.dtype());
    MCC_RETURN_IF_ERROR(
        ops::DropoutBackward(demb, p, config_.seed, emb_offset, &d));
    demb = d;
  }
  MCC_RETURN_IF_ERROR(word_embeddings_->Backward(ids, demb));
  if (position_embeddings_ != nullptr) {
    MCC_RETURN_IF_ERROR(ops::EmbeddingBackward(
        positions, demb, &position_embeddings_->main_grad));
  }
  ParameterList embeddings = {word_embeddings_->weight()};
  if (position_embeddings_ != nullptr) {
    embeddings.push_back(position_embeddings_);
  }
  MCC_RETURN_IF_ERROR(GradsReady(embeddings));
  return result;
}

}  // namespace gpt
}  // namespace mcc
