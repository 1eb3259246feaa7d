#include "parallel/vocab_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/embedding.h"
#include "core/ops/index_check.h"
#include "core/status_macros.h"
#include "parallel/mappings.h"

namespace mcc {
namespace parallel {

absl::Status MarkVocabPadding(Parameter* weight, int64_t vocab_size) {
  const int64_t global_rows = weight->global_shape.at(0);
  if (weight->partition_dim > 0 || vocab_size <= 0 ||
      vocab_size > global_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        weight->name, ": a vocabulary of ", vocab_size,
        " does not pad to the rows of ", ShapeToString(weight->global_shape),
        " split along dimension ", weight->partition_dim));
  }
  weight->unpadded_rows = vocab_size;
  const int64_t local = weight->value.size(0);
  const int64_t first =
      weight->partition_dim == 0 ? local * weight->partition_rank : 0;
  const int64_t keep = std::clamp<int64_t>(vocab_size - first, 0, local);
  if (keep == local) return absl::OkStatus();
  MCC_ASSIGN_OR_RETURN(Tensor padding, weight->value.Slice(keep, local));
  padding.Zero();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<VocabParallelEmbedding>>
VocabParallelEmbedding::Create(const std::string& name, int64_t vocab_size,
                               int64_t padded_vocab_size, int64_t hidden,
                               const InitSpec& init,
                               const LayerContext& context) {
  const int tp = GroupSize(context.tp_group);
  if (padded_vocab_size % tp != 0 || padded_vocab_size < vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": padded vocabulary size ", padded_vocab_size,
                     " is not divisible by the tensor-parallel size ", tp,
                     " or is below the vocabulary of ", vocab_size));
  }
  auto layer =
      std::unique_ptr<VocabParallelEmbedding>(new VocabParallelEmbedding);
  layer->context_ = context;
  layer->local_vocab_ = padded_vocab_size / tp;
  layer->vocab_start_ = layer->local_vocab_ * GroupRank(context.tp_group);
  MCC_ASSIGN_OR_RETURN(layer->weight_,
                       MakeParameter(name, {padded_vocab_size, hidden}, 0, init,
                                     context, /*weight_decay=*/true));
  MCC_RETURN_IF_ERROR(MarkVocabPadding(layer->weight_.get(), vocab_size));
  return layer;
}

absl::StatusOr<Tensor> VocabParallelEmbedding::Forward(
    const Tensor& ids) const {
  const int64_t hidden = weight_->value.size(1);
  Tensor out = Tensor::Empty({ids.numel(), hidden}, weight_->value.dtype(),
                             weight_->value.device());
  ops::EmbeddingShard shard;
  shard.vocab_start = vocab_start_;
  shard.mask_outside = GroupSize(context_.tp_group) > 1;
  MCC_ASSIGN_OR_RETURN(Tensor flat_ids, ids.Reshape({-1}));
  MCC_RETURN_IF_ERROR(
      ops::EmbeddingLookup(flat_ids, weight_->value, &out, shard));
  if (GroupSize(context_.tp_group) > 1) {
    MCC_RETURN_IF_ERROR(
        context_.tp_group->AllReduceSync(&out, comm::ReduceOp::kSum));
  }
  return out;
}

absl::Status VocabParallelEmbedding::Backward(const Tensor& ids,
                                              const Tensor& dout) const {
  ops::EmbeddingShard shard;
  shard.vocab_start = vocab_start_;
  shard.mask_outside = GroupSize(context_.tp_group) > 1;
  MCC_ASSIGN_OR_RETURN(Tensor flat_ids, ids.Reshape({-1}));
  return ops::EmbeddingBackward(flat_ids, dout, &weight_->main_grad, shard);
}

absl::StatusOr<Tensor> VocabParallelCrossEntropy::Forward(
    comm::ProcessGroup* tp, const Tensor& logits, const Tensor& targets,
    int64_t vocab_start, int64_t vocab_size, Activations* act,
    int64_t ignore_index) {
  if (logits.dim() != 2 || targets.numel() != logits.size(0) ||
      (targets.dtype() != DType::kInt32 && targets.dtype() != DType::kInt64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab-parallel cross entropy: logits ", logits.Describe(),
                     " and targets ", targets.Describe(),
                     " must be [tokens, vocab] and integer [tokens]"));
  }
  const int64_t tokens = logits.size(0);
  const int64_t local = logits.size(1);
  // Columns [valid, local) are vocabulary padding: no probability.
  const int64_t valid = std::clamp<int64_t>(vocab_size - vocab_start, 0, local);
  // Targets are data: checked where they live, by a kernel.
  MCC_RETURN_IF_ERROR(ops::CheckIndexRange(targets, vocab_size, ignore_index,
                                           "cross entropy: target"));
  const Device device = logits.device();
  // Row maxima, reduced over TP.
  Tensor row_max = Tensor::Empty({tokens}, DType::kFloat32, device);
  MCC_RETURN_IF_ERROR(ops::ShardedCrossEntropyRowMax(logits, valid, &row_max));
  if (GroupSize(tp) > 1) {
    MCC_RETURN_IF_ERROR(tp->AllReduceSync(&row_max, comm::ReduceOp::kMax));
  }
  // Sums of exp(z - max) and the target logits, reduced together.
  Tensor sums = Tensor::Empty({2, tokens}, DType::kFloat32, device);
  MCC_RETURN_IF_ERROR(ops::ShardedCrossEntropySums(logits, targets, row_max,
                                                   vocab_start, valid, &sums));
  if (GroupSize(tp) > 1) {
    MCC_RETURN_IF_ERROR(tp->AllReduceSync(&sums, comm::ReduceOp::kSum));
  }
  Tensor loss = Tensor::Empty({tokens}, DType::kFloat32, device);
  MCC_RETURN_IF_ERROR(
      ops::ShardedCrossEntropyLoss(sums, targets, ignore_index, &loss));
  // The backward recomputes the softmax from the logits, the row maxima and
  // the sums: no [tokens, vocab] fp32 copy is kept.
  act->logits = logits;
  act->row_max = row_max;
  act->sums = sums;
  act->targets = targets;
  act->vocab_start = vocab_start;
  act->valid = valid;
  act->ignore_index = ignore_index;
  return loss;
}

absl::StatusOr<Tensor> VocabParallelCrossEntropy::Backward(
    const Tensor& dloss, const Activations& act, DType dtype) {
  if (!act.logits.defined()) {
    return absl::FailedPreconditionError(
        "cross entropy backward: no activations (forward not run?)");
  }
  const int64_t tokens = act.logits.size(0);
  if (dloss.numel() != tokens || dloss.dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("cross entropy backward: dloss ", dloss.Describe(),
                     " does not match ", tokens, " tokens"));
  }
  Tensor grad = Tensor::Empty(act.logits.shape(), dtype, act.logits.device());
  MCC_RETURN_IF_ERROR(ops::ShardedCrossEntropyBackward(
      act.logits, act.targets, act.row_max, act.sums,
      dloss.Reshape({tokens}).value(), act.vocab_start, act.valid,
      act.ignore_index, &grad));
  return grad;
}

}  // namespace parallel
}  // namespace mcc
