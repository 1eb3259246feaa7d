#include "parallel/testing/mlp_stack.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/ops/elementwise.h"
#include "core/ops/multi_tensor.h"
#include "core/status_macros.h"

namespace mcc {
namespace parallel {
namespace testing {

struct MlpStack::Record : ActivationRecord {
  int microbatch = 0;
  std::vector<MlpBlock::Activations> blocks;
  Tensor output;                     // The last stage's, for the loss gradient.
  DeferredWeightGrads weight_grads;  // Split backward: what W runs.
};

MlpBatch MakeMlpBatch(const MlpStackConfig& config, int step, int index,
                      int64_t rows) {
  // A few batches recur, so the loss falls over the steps.
  std::mt19937 rng(500 + 31 * (step % 3) + index);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t h = config.hidden;
  std::vector<float> x(rows * h), y(rows * h);
  for (float& v : x) v = normal(rng);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < h; ++c) {
      y[r * h + c] =
          0.5f * std::sin(x[r * h + (c + 1) % h]) + 0.25f * x[r * h + c];
    }
  }
  return {*Tensor::FromVector(x, {rows, h}), *Tensor::FromVector(y, {rows, h})};
}

absl::StatusOr<std::unique_ptr<MlpStack>> MlpStack::Create(
    const MlpStackConfig& config, const LayerContext& context, int first_block,
    int num_blocks) {
  if (first_block < 0 || num_blocks < 1 ||
      first_block + num_blocks > config.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpStack: blocks [", first_block, ", ", first_block + num_blocks,
        ") of a ", config.num_blocks, "-block stack"));
  }
  if (context.dtype != DType::kFloat32 || context.sequence_parallel) {
    return absl::InvalidArgumentError(
        "MlpStack: fp32 without sequence parallelism only");
  }
  auto model = std::unique_ptr<MlpStack>(new MlpStack);
  model->config_ = config;
  model->context_ = context;
  model->first_block_ = first_block;
  LinearOptions options;
  options.weight_init = InitSpec::Normal(0.2f);
  for (int i = first_block; i < first_block + num_blocks; ++i) {
    const std::string name = absl::StrCat("blocks.", i);
    MCC_ASSIGN_OR_RETURN(
        MlpBlock block, MlpBlock::Create(name, config.hidden, config.ffn_hidden,
                                         options, context));
    ParameterList unit;
    block.AppendParameters(&unit);
    for (const auto& p : unit) model->parameters_.push_back(p);
    model->units_.push_back(std::move(unit));
    model->blocks_.push_back(std::move(block));
  }
  return model;
}

absl::StatusOr<const MlpBatch*> MlpStack::Batch(int microbatch) const {
  const int n = batches_ == nullptr ? 0 : static_cast<int>(batches_->size());
  if (microbatch < 0 || microbatch >= n) {
    return absl::OutOfRangeError(
        absl::StrCat("MlpStack from block ", first_block_, ": micro-batch ",
                     microbatch, " asked for, but SetMicroBatches gave ", n));
  }
  return &(*batches_)[microbatch];
}

absl::StatusOr<TensorSpec> MlpStack::InputSpec(int microbatch) const {
  MCC_ASSIGN_OR_RETURN(const MlpBatch* batch, Batch(microbatch));
  TensorSpec spec;
  spec.shape = {batch->inputs.size(0), config_.hidden};
  spec.dtype = DType::kFloat32;
  spec.device = batch->inputs.device();
  return spec;
}

absl::StatusOr<TensorSpec> MlpStack::OutputSpec(int microbatch) const {
  return InputSpec(microbatch);  // The residual stream keeps its shape.
}

namespace {

// a + b, fp32, on their device.
absl::StatusOr<Tensor> Add(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::Empty(a.shape(), DType::kFloat32, a.device());
  MCC_RETURN_IF_ERROR(ops::Add(a, b, &out));
  return out;
}

// a - b, fp32, on their device (fmaf(-1, b, a) is a - b rounded once).
absl::StatusOr<Tensor> Subtract(const Tensor& a, const Tensor& b) {
  Tensor out = a.Clone();
  MCC_RETURN_IF_ERROR(ops::Accumulate(b, -1.0f, &out));
  return out;
}

}  // namespace

absl::StatusOr<StageOutput> MlpStack::ForwardStep(int microbatch,
                                                  const Tensor& input,
                                                  bool backward_after) {
  MCC_ASSIGN_OR_RETURN(const MlpBatch* batch, Batch(microbatch));
  MCC_ASSIGN_OR_RETURN(const TensorSpec spec, InputSpec(microbatch));
  Tensor x = takes_batch_input() ? batch->inputs : input;
  if (x.shape() != spec.shape || x.dtype() != spec.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlpStack from block ", first_block_, ": input ",
                     x.Describe(), " is not ", ShapeToString(spec.shape)));
  }
  auto record = std::make_unique<Record>();
  record->microbatch = microbatch;
  record->blocks.resize(blocks_.size());
  for (int i = 0; i < num_blocks(); ++i) {
    MCC_RETURN_IF_ERROR(CallBeforeForward(i));
    MCC_ASSIGN_OR_RETURN(Tensor y, blocks_[i].Forward(x, &record->blocks[i]));
    MCC_RETURN_IF_ERROR(CallAfterForward(i));
    MCC_ASSIGN_OR_RETURN(x, Add(x, y));
  }
  StageOutput out;
  if (computes_loss()) {
    // The loss stays on the device as ops::LossSum's [4]: half the sum of
    // squares (a hi/lo pair; halving is exact) and the row count (the zero
    // count's slots, which hold 0 without count_zeros).
    MCC_ASSIGN_OR_RETURN(Tensor d, Subtract(x, batch->targets));
    out.loss_sum = Tensor::Empty({4}, DType::kFloat32, x.device());
    MCC_RETURN_IF_ERROR(
        ops::MultiTensorSumOfSquares({d}, {}, {}, &out.loss_sum));
    MCC_ASSIGN_OR_RETURN(Tensor sum, out.loss_sum.Slice(0, 2));
    MCC_RETURN_IF_ERROR(ops::Scale(sum, 0.5f, &sum));
    MCC_ASSIGN_OR_RETURN(Tensor rows, out.loss_sum.Slice(2, 3));
    rows.Fill(static_cast<double>(x.size(0)));
    record->output = x;
  } else {
    out.output = x;
  }
  if (backward_after) out.record = std::move(record);
  return out;
}

absl::StatusOr<Tensor> MlpStack::BackwardStep(
    const Tensor& output_grad, float grad_scale,
    std::unique_ptr<ActivationRecord> record) {
  return Backward(output_grad, grad_scale, record.get(), nullptr);
}

absl::StatusOr<Tensor> MlpStack::BackwardInputStep(
    const Tensor& output_grad, float grad_scale,
    std::unique_ptr<ActivationRecord>* record) {
  if (!UnitHooksAllowSplitBackward()) {
    return PipelineStage::BackwardInputStep(output_grad, grad_scale, record);
  }
  auto* rec = dynamic_cast<Record*>(record->get());
  return Backward(output_grad, grad_scale, rec,
                  rec != nullptr ? &rec->weight_grads : nullptr);
}

absl::Status MlpStack::BackwardWeightStep(
    std::unique_ptr<ActivationRecord> record) {
  // B ran the whole backward (hooks that do not allow the split).
  if (record == nullptr) return absl::OkStatus();
  auto* rec = dynamic_cast<Record*>(record.get());
  if (rec == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlpStack from block ", first_block_,
                     ": the weight gradient needs the record of this stack's "
                     "BackwardInputStep"));
  }
  return rec->weight_grads.Run();
}

absl::StatusOr<Tensor> MlpStack::Backward(const Tensor& output_grad,
                                          float grad_scale,
                                          ActivationRecord* record,
                                          DeferredWeightGrads* deferred) {
  auto* rec = dynamic_cast<Record*>(record);
  if (rec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpStack from block ", first_block_,
        ": backward needs the record of this stack's ForwardStep"));
  }
  MCC_ASSIGN_OR_RETURN(const MlpBatch* batch, Batch(rec->microbatch));
  Tensor dx;
  if (computes_loss()) {
    // d(mean loss)/d(output) = (output - target) / rows.
    const Tensor& out = rec->output;
    const float scale = grad_scale / static_cast<float>(out.size(0));
    MCC_ASSIGN_OR_RETURN(dx, Subtract(out, batch->targets));
    MCC_RETURN_IF_ERROR(ops::Scale(dx, scale, &dx));
  } else {
    MCC_ASSIGN_OR_RETURN(const TensorSpec spec, OutputSpec(rec->microbatch));
    if (output_grad.shape() != spec.shape ||
        output_grad.dtype() != spec.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MlpStack from block ", first_block_, ": output gradient ",
          output_grad.Describe(), " is not ", ShapeToString(spec.shape)));
    }
    dx = output_grad;
  }
  for (int i = num_blocks() - 1; i >= 0; --i) {
    MCC_RETURN_IF_ERROR(CallBeforeBackward(i));
    MCC_ASSIGN_OR_RETURN(Tensor dpath,
                         blocks_[i].Backward(dx, &rec->blocks[i], deferred));
    // The unit's gradients are complete after its weight gradients.
    auto done = [this, i]() -> absl::Status {
      MCC_RETURN_IF_ERROR(CallAfterBackward(i));
      return CallGradsReady(units_[i]);
    };
    if (deferred != nullptr) {
      deferred->Add(std::move(done));
    } else {
      MCC_RETURN_IF_ERROR(done());
    }
    MCC_ASSIGN_OR_RETURN(
        dx, Add(dx, dpath));  // The residual's gradient plus the block's.
  }
  if (takes_batch_input()) return Tensor();
  return dx;
}

absl::StatusOr<MlpStackChunks> CreateMlpStackChunks(
    const MlpStackConfig& config, const LayerContext& context, int stages,
    int stage, int virtual_stages) {
  const int per_chunk = config.num_blocks / (stages * virtual_stages);
  MlpStackChunks local;
  for (int v = 0; v < virtual_stages; ++v) {
    MCC_ASSIGN_OR_RETURN(
        std::unique_ptr<MlpStack> chunk,
        MlpStack::Create(config, context, (v * stages + stage) * per_chunk,
                         per_chunk));
    for (const auto& p : chunk->parameters()) local.parameters.push_back(p);
    local.stages.push_back(chunk.get());
    local.models.push_back(chunk.get());
    local.chunks.push_back(std::move(chunk));
  }
  return local;
}

}  // namespace testing
}  // namespace parallel
}  // namespace mcc
