#include "tiny_lm.h"

#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/loss_sum.h"
#include "core/status_macros.h"

namespace tiny_lm {

using mcc::DType;
using mcc::Tensor;
namespace parallel = mcc::parallel;
namespace ops = mcc::ops;

struct TinyLm::Record : parallel::ActivationRecord {
  int microbatch = 0;
  std::vector<parallel::MlpBlock::Activations> blocks;
  std::vector<mcc::moe::MoeMlp::Activations> moe_blocks;
  parallel::ColumnParallelLinear::Activations head;
  parallel::VocabParallelCrossEntropy::Activations cross_entropy;
  Tensor loss_sum;
  parallel::DeferredWeightGrads weight_grads;  // Split backward: for W.
};

TinyLmBatch MakeBatch(const TinyLmConfig& config, int step, int index) {
  std::mt19937 rng(900 + 17 * (step % 3) + index);
  std::uniform_int_distribution<int64_t> token(0, config.vocab - 1);
  std::uniform_real_distribution<float> coin(0.0f, 1.0f);
  const int64_t n = config.seq_length;
  std::vector<int64_t> ids, labels;
  for (int64_t s = 0; s < config.sequences_per_microbatch; ++s) {
    // n + 1 tokens: inputs are the first n, labels the last n.
    std::vector<int64_t> seq = {token(rng)};
    while (static_cast<int64_t>(seq.size()) < n + 1) {
      const int64_t next = (3 * seq.back() + 1) % config.vocab;
      seq.push_back(coin(rng) < 0.1f ? token(rng) : next);
    }
    ids.insert(ids.end(), seq.begin(), seq.end() - 1);
    labels.insert(labels.end(), seq.begin() + 1, seq.end());
  }
  const int64_t tokens = static_cast<int64_t>(ids.size());
  return {*Tensor::FromInts(ids, {tokens}),
          *Tensor::FromInts(labels, {tokens})};
}

absl::StatusOr<std::unique_ptr<TinyLm>> TinyLm::Create(
    const TinyLmConfig& config, const parallel::LayerContext& context,
    int first_block, int num_blocks) {
  if (first_block < 0 || num_blocks < 1 ||
      first_block + num_blocks > config.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TinyLm: blocks [", first_block, ", ", first_block + num_blocks,
        ") of a ", config.num_blocks, "-block model"));
  }
  if (context.dtype != DType::kFloat32 || context.tp_group != nullptr) {
    return absl::InvalidArgumentError(
        "TinyLm: fp32 without tensor parallelism only");
  }
  auto model = std::unique_ptr<TinyLm>(new TinyLm);
  model->config_ = config;
  model->context_ = context;
  model->first_block_ = first_block;
  const parallel::InitSpec init = parallel::InitSpec::Normal(0.2f);
  if (first_block == 0) {
    MCC_ASSIGN_OR_RETURN(model->embedding_,
                         parallel::VocabParallelEmbedding::Create(
                             "embedding", config.vocab, config.vocab,
                             config.hidden, init, context));
    model->units_.push_back({model->embedding_->weight()});
  }
  parallel::LinearOptions options;
  options.weight_init = init;
  for (int i = first_block; i < first_block + num_blocks; ++i) {
    const std::string name = absl::StrCat("blocks.", i);
    mcc::ParameterList unit;
    if (config.num_experts > 0) {
      mcc::moe::MoeMlpConfig moe;
      moe.hidden_size = config.hidden;
      moe.num_experts = config.num_experts;
      moe.ffn_hidden_size = config.ffn_hidden;
      moe.router.topk = config.moe_topk;
      moe.aux_loss_coeff = config.moe_aux_loss_coeff;
      moe.activation = mcc::moe::ExpertActivation::kGelu;
      moe.init_std = 0.2f;
      moe.seed = 1000 + i;  // By global block: every split the same weights.
      moe.device = context.device;
      MCC_ASSIGN_OR_RETURN(auto block,
                           mcc::moe::MoeMlp::Create(name + ".moe", moe));
      block->AppendParameters(&unit);
      model->moe_blocks_.push_back(std::move(block));
    } else {
      MCC_ASSIGN_OR_RETURN(
          parallel::MlpBlock block,
          parallel::MlpBlock::Create(name, config.hidden, config.ffn_hidden,
                                     options, context));
      block.AppendParameters(&unit);
      model->blocks_.push_back(std::move(block));
    }
    model->units_.push_back(std::move(unit));
  }
  if (first_block + num_blocks == config.num_blocks) {
    parallel::LinearOptions head_options;
    head_options.bias = false;
    head_options.weight_init = init;
    MCC_ASSIGN_OR_RETURN(model->head_, parallel::ColumnParallelLinear::Create(
                                           "head", config.hidden, config.vocab,
                                           head_options, context));
    mcc::ParameterList unit;
    model->head_->AppendParameters(&unit);
    model->units_.push_back(std::move(unit));
  }
  for (const auto& unit : model->units_) {
    for (const auto& p : unit) model->params_.push_back(p);
  }
  return model;
}

absl::StatusOr<const TinyLmBatch*> TinyLm::Batch(int microbatch) const {
  const int n = batches_ == nullptr ? 0 : static_cast<int>(batches_->size());
  if (microbatch < 0 || microbatch >= n) {
    return absl::OutOfRangeError(
        absl::StrCat("TinyLm from block ", first_block_, ": micro-batch ",
                     microbatch, " asked for, but SetMicroBatches gave ", n));
  }
  return &(*batches_)[microbatch];
}

absl::StatusOr<parallel::TensorSpec> TinyLm::InputSpec(int microbatch) const {
  MCC_ASSIGN_OR_RETURN(const TinyLmBatch* batch, Batch(microbatch));
  parallel::TensorSpec spec;
  spec.shape = {batch->ids.numel(), config_.hidden};
  spec.dtype = DType::kFloat32;
  spec.device = context_.device;
  return spec;
}

absl::StatusOr<parallel::TensorSpec> TinyLm::OutputSpec(int microbatch) const {
  return InputSpec(microbatch);  // The residual stream keeps its shape.
}

namespace {

absl::StatusOr<Tensor> Add(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::Empty(a.shape(), DType::kFloat32, a.device());
  MCC_RETURN_IF_ERROR(ops::Add(a, b, &out));
  return out;
}

}  // namespace

absl::StatusOr<parallel::StageOutput> TinyLm::ForwardStep(int microbatch,
                                                          const Tensor& input,
                                                          bool backward_after) {
  MCC_ASSIGN_OR_RETURN(const TinyLmBatch* batch, Batch(microbatch));
  MCC_ASSIGN_OR_RETURN(const parallel::TensorSpec spec, InputSpec(microbatch));
  auto record = std::make_unique<Record>();
  record->microbatch = microbatch;
  record->blocks.resize(blocks_.size());
  record->moe_blocks.resize(moe_blocks_.size());
  Tensor x;
  if (embedding_) {
    MCC_RETURN_IF_ERROR(CallBeforeForward(0));
    MCC_ASSIGN_OR_RETURN(x, embedding_->Forward(batch->ids));
    MCC_RETURN_IF_ERROR(CallAfterForward(0));
  } else {
    if (input.shape() != spec.shape || input.dtype() != spec.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TinyLm from block ", first_block_, ": input ", input.Describe(),
          " is not ", mcc::ShapeToString(spec.shape)));
    }
    x = input;
  }
  for (int i = 0; i < local_blocks(); ++i) {
    const int unit = first_block_unit() + i;
    MCC_RETURN_IF_ERROR(CallBeforeForward(unit));
    Tensor y;
    if (moe_blocks_.empty()) {
      MCC_ASSIGN_OR_RETURN(y, blocks_[i].Forward(x, &record->blocks[i]));
    } else {
      MCC_ASSIGN_OR_RETURN(
          y, moe_blocks_[i]->Forward(x, config_.sequences_per_microbatch,
                                     &record->moe_blocks[i]));
    }
    MCC_RETURN_IF_ERROR(CallAfterForward(unit));
    MCC_ASSIGN_OR_RETURN(x, Add(x, y));
  }
  parallel::StageOutput out;
  if (head_) {
    const int unit = static_cast<int>(units_.size()) - 1;
    MCC_RETURN_IF_ERROR(CallBeforeForward(unit));
    MCC_ASSIGN_OR_RETURN(Tensor logits, head_->Forward(x, &record->head));
    MCC_RETURN_IF_ERROR(CallAfterForward(unit));
    MCC_ASSIGN_OR_RETURN(Tensor loss,
                         parallel::VocabParallelCrossEntropy::Forward(
                             nullptr, logits, batch->labels, 0, config_.vocab,
                             &record->cross_entropy));
    // The summed loss and its token count stay on the device; the pipeline
    // executor totals them and the training loop reads them once a step.
    out.loss_sum = Tensor::Empty({4}, DType::kFloat32, loss.device());
    MCC_RETURN_IF_ERROR(ops::LossSum(loss, Tensor(), batch->labels,
                                     ops::kDefaultIgnoreIndex,
                                     /*accumulate=*/false, &out.loss_sum));
    record->loss_sum = out.loss_sum;
  } else {
    out.output = x;
  }
  if (backward_after) out.record = std::move(record);
  return out;
}

absl::StatusOr<Tensor> TinyLm::BackwardStep(
    const Tensor& output_grad, float grad_scale,
    std::unique_ptr<parallel::ActivationRecord> record) {
  return Backward(output_grad, grad_scale, dynamic_cast<Record*>(record.get()),
                  nullptr);
}

absl::StatusOr<Tensor> TinyLm::BackwardInputStep(
    const Tensor& output_grad, float grad_scale,
    std::unique_ptr<parallel::ActivationRecord>* record) {
  if (!UnitHooksAllowSplitBackward()) {
    return PipelineStage::BackwardInputStep(output_grad, grad_scale, record);
  }
  auto* rec = dynamic_cast<Record*>(record->get());
  return Backward(output_grad, grad_scale, rec,
                  rec != nullptr ? &rec->weight_grads : nullptr);
}

absl::Status TinyLm::BackwardWeightStep(
    std::unique_ptr<parallel::ActivationRecord> record) {
  if (record == nullptr) return absl::OkStatus();  // B ran it all.
  auto* rec = dynamic_cast<Record*>(record.get());
  if (rec == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("TinyLm from block ", first_block_,
                     ": the weight gradient needs the record of this model's "
                     "BackwardInputStep"));
  }
  return rec->weight_grads.Run();
}

absl::StatusOr<Tensor> TinyLm::Backward(
    const Tensor& output_grad, float grad_scale, Record* rec,
    parallel::DeferredWeightGrads* deferred) {
  if (rec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TinyLm from block ", first_block_,
        ": backward needs the record of this model's ForwardStep"));
  }
  MCC_ASSIGN_OR_RETURN(const TinyLmBatch* batch, Batch(rec->microbatch));
  // A unit's hooks run once its weight gradients are in: now, or in W.
  const auto unit_done = [this, deferred](int unit) -> absl::Status {
    auto done = [this, unit]() -> absl::Status {
      MCC_RETURN_IF_ERROR(CallAfterBackward(unit));
      return CallGradsReady(units_[unit]);
    };
    if (deferred == nullptr) return done();
    deferred->Add(std::move(done));
    return absl::OkStatus();
  };
  Tensor dx;
  if (head_) {
    const int unit = static_cast<int>(units_.size()) - 1;
    MCC_RETURN_IF_ERROR(CallBeforeBackward(unit));
    Tensor dloss = Tensor::Empty({batch->labels.numel()}, DType::kFloat32,
                                 rec->loss_sum.device());
    MCC_RETURN_IF_ERROR(
        ops::LossSumGradient(rec->loss_sum, Tensor(), grad_scale, &dloss));
    MCC_ASSIGN_OR_RETURN(Tensor dlogits,
                         parallel::VocabParallelCrossEntropy::Backward(
                             dloss, rec->cross_entropy, DType::kFloat32));
    MCC_ASSIGN_OR_RETURN(dx, head_->Backward(dlogits, rec->head, deferred));
    MCC_RETURN_IF_ERROR(unit_done(unit));
  } else {
    MCC_ASSIGN_OR_RETURN(const parallel::TensorSpec spec,
                         OutputSpec(rec->microbatch));
    if (output_grad.shape() != spec.shape ||
        output_grad.dtype() != spec.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TinyLm from block ", first_block_, ": output gradient ",
          output_grad.Describe(), " is not ", mcc::ShapeToString(spec.shape)));
    }
    dx = output_grad;
  }
  for (int i = local_blocks() - 1; i >= 0; --i) {
    const int unit = first_block_unit() + i;
    MCC_RETURN_IF_ERROR(CallBeforeBackward(unit));
    Tensor dpath;
    if (moe_blocks_.empty()) {
      MCC_ASSIGN_OR_RETURN(dpath,
                           blocks_[i].Backward(dx, &rec->blocks[i], deferred));
    } else {
      // The balancing loss adds to the LM loss: its gradient scales alike.
      MCC_ASSIGN_OR_RETURN(
          dpath, moe_blocks_[i]->Backward(dx, rec->moe_blocks[i], grad_scale));
      rec->moe_blocks[i] = mcc::moe::MoeMlp::Activations();
    }
    MCC_RETURN_IF_ERROR(unit_done(unit));
    // The residual's gradient plus the block's.
    MCC_ASSIGN_OR_RETURN(dx, Add(dx, dpath));
  }
  if (!embedding_) return dx;
  MCC_RETURN_IF_ERROR(CallBeforeBackward(0));
  auto embedding_grad = [this, ids = batch->ids, dx]() {
    return embedding_->Backward(ids, dx);
  };
  if (deferred != nullptr) {
    deferred->Add(std::move(embedding_grad));
  } else {
    MCC_RETURN_IF_ERROR(embedding_grad());
  }
  MCC_RETURN_IF_ERROR(unit_done(0));
  return Tensor();
}

}  // namespace tiny_lm
