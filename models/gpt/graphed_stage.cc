#include "models/gpt/graphed_stage.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/ops/index_check.h"
#include "core/status_macros.h"
#include "parallel/mappings.h"

namespace mcc {
namespace gpt {
namespace {

// What BackwardStep receives for a graphed micro-batch: the activations
// live in the graphs' memory, so it carries nothing.
struct GraphRecord : parallel::ActivationRecord {};

absl::Status Refuse(const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--cuda-graph: ", why,
                   " (see models/gpt/graphed_stage.h "
                   "for the layouts it covers)"));
}

bool SameLayout(const Tensor& a, const Tensor& b) {
  return a.defined() == b.defined() &&
         (!a.defined() || (a.shape() == b.shape() && a.dtype() == b.dtype()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GraphedStage>> GraphedStage::Create(
    GPTModel* model, GraphedStageOptions options) {
  if (model == nullptr) return Refuse("no model");
  const GPTConfig& config = model->config();
  const parallel::LayerContext& ctx = model->context();
  if (!model->chunk().pre_process || !model->chunk().post_process) {
    return Refuse(
        "the model must be whole on this rank (pipeline parallelism sends "
        "and receives inside the captured region); use "
        "--pipeline-model-parallel-size 1");
  }
  if (config.hidden_dropout > 0 || config.attention_dropout > 0) {
    return Refuse(absl::StrCat(
        "dropout draws its Philox offsets from a host counter that a graph "
        "would freeze; use --hidden-dropout 0 --attention-dropout 0 (got ",
        config.hidden_dropout, ", ", config.attention_dropout, ")"));
  }
  if (config.cpu_offloading) {
    return Refuse(
        "--cpu-offloading copies on a side stream inside the "
        "captured region; drop one of the two flags");
  }
  if (parallel::GroupSize(ctx.tp_group) > 1) {
    return Refuse(
        "tensor parallelism communicates inside the captured region; use "
        "--tensor-model-parallel-size 1");
  }
  if (parallel::GroupSize(ctx.cp_group) > 1) {
    return Refuse(
        "context parallelism communicates inside the captured region; use "
        "--context-parallel-size 1");
  }
  if (!GraphCaptureSupported(ctx.device.type)) {
    return Refuse(absl::StrCat("graph capture is not supported on ",
                               ctx.device.ToString(), " (use --device cuda)"));
  }
  return std::unique_ptr<GraphedStage>(new GraphedStage(model, options));
}

void GraphedStage::SetMicroBatches(
    std::shared_ptr<const std::vector<MicroBatch>> batches) {
  batches_ = batches;
  model_->SetMicroBatches(std::move(batches));
}

void GraphedStage::SetModelList(
    std::shared_ptr<const std::vector<MicroBatch>> list) {
  own_list_ = list;
  model_->SetMicroBatches(std::move(list));
}

absl::Status GraphedStage::SetMicroBatches(std::vector<MicroBatch> batches) {
  SetMicroBatches(
      std::make_shared<const std::vector<MicroBatch>>(std::move(batches)));
  return absl::OkStatus();
}

absl::StatusOr<const MicroBatch*> GraphedStage::Batch(int microbatch) const {
  const int n = batches_ == nullptr ? 0 : static_cast<int>(batches_->size());
  if (microbatch < 0 || microbatch >= n) {
    return absl::OutOfRangeError(
        absl::StrCat("--cuda-graph stage: micro-batch ", microbatch,
                     " asked for, but SetMicroBatches gave ", n));
  }
  return &(*batches_)[microbatch];
}

absl::StatusOr<parallel::TensorSpec> GraphedStage::InputSpec(
    int microbatch) const {
  // Hidden states [s * b, hidden] (the model is whole: no CP, no SP).
  MCC_ASSIGN_OR_RETURN(const MicroBatch* batch, Batch(microbatch));
  parallel::TensorSpec spec;
  spec.shape =
      model_->HiddenShape(batch->tokens.size(0), batch->tokens.size(1));
  spec.dtype = model_->context().dtype;
  spec.device = model_->context().device;
  return spec;
}

absl::StatusOr<parallel::TensorSpec> GraphedStage::OutputSpec(
    int microbatch) const {
  return InputSpec(microbatch);
}

bool GraphedStage::MatchesStatic(const MicroBatch& batch) const {
  return forward_graph_.valid() &&
         SameLayout(batch.tokens, static_batch_.tokens) &&
         SameLayout(batch.labels, static_batch_.labels) &&
         SameLayout(batch.loss_mask, static_batch_.loss_mask);
}

absl::StatusOr<parallel::StageOutput> GraphedStage::Eager(
    const MicroBatch& batch) {
  SetModelList(std::make_shared<const std::vector<MicroBatch>>(1, batch));
  return model_->ForwardStep(0, Tensor(), /*backward_after=*/true);
}

void GraphedStage::DropGraphs() {
  forward_graph_ = DeviceGraph();
  backward_graph_ = DeviceGraph();
  captured_record_.reset();
  static_loss_sum_ = Tensor();
}

absl::Status GraphedStage::CaptureForward(const MicroBatch& batch) {
  DropGraphs();
  static_batch_.tokens = batch.tokens.Clone();
  static_batch_.labels = batch.labels.Clone();
  static_batch_.loss_mask =
      batch.loss_mask.defined() ? batch.loss_mask.Clone() : Tensor();
  SetModelList(
      std::make_shared<const std::vector<MicroBatch>>(1, static_batch_));
  GraphCaptureOptions options;
  options.index_inputs_checked_outside = true;  // By ForwardStep.
  MCC_RETURN_IF_ERROR(BeginGraphCapture(model_->context().device, options));
  absl::StatusOr<parallel::StageOutput> out =
      model_->ForwardStep(0, Tensor(), /*backward_after=*/true);
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  if (!out.ok()) return out.status();
  if (!graph.ok()) return graph.status();
  forward_graph_ = *std::move(graph);
  static_loss_sum_ = out->loss_sum;
  captured_record_ = std::move(out->record);
  ++stats_.captures;
  return absl::OkStatus();
}

absl::Status GraphedStage::CaptureBackward(float grad_scale) {
  MCC_RETURN_IF_ERROR(BeginGraphCapture(model_->context().device));
  absl::StatusOr<Tensor> dx =
      model_->BackwardStep(Tensor(), grad_scale, std::move(captured_record_));
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  if (!dx.ok()) return dx.status();
  if (!graph.ok()) return graph.status();
  backward_graph_ = *std::move(graph);
  backward_scale_ = grad_scale;
  return absl::OkStatus();
}

absl::StatusOr<parallel::StageOutput> GraphedStage::ForwardStep(
    int microbatch, const Tensor& input, bool backward_after) {
  if (pending_ != Pending::kNone) {
    return absl::FailedPreconditionError(
        "--cuda-graph stage: a forward before the previous micro-batch's "
        "backward (only schedules without pipelining are supported)");
  }
  if (!backward_after) {
    // Evaluation: eager, on the model's own micro-batches.
    return model_->ForwardStep(microbatch, input, false);
  }
  // A list given to the model since this stage last set it: adopted.
  if (std::shared_ptr<const std::vector<MicroBatch>> given =
          model_->micro_batches();
      given != nullptr && given != own_list_) {
    batches_ = std::move(given);
  }
  MCC_ASSIGN_OR_RETURN(const MicroBatch* batch, Batch(microbatch));
  if (!warmed_up_ || (forward_graph_.valid() && !MatchesStatic(*batch))) {
    MCC_ASSIGN_OR_RETURN(parallel::StageOutput out, Eager(*batch));
    pending_ = Pending::kEager;
    ++stats_.eager_microbatches;
    return out;
  }
  // The model's own label check cannot run inside the graph: it runs here.
  MCC_RETURN_IF_ERROR(ops::CheckIndexRange(batch->labels,
                                           model_->config().vocab_size, -100,
                                           "cross entropy: target"));
  if (!forward_graph_.valid()) {
    absl::Status captured = CaptureForward(*batch);
    if (!captured.ok()) {
      DropGraphs();
      return absl::Status(
          captured.code(),
          absl::StrCat("--cuda-graph: capturing the forward of micro-batch ",
                       microbatch, " failed: ", captured.message()));
    }
  } else {
    if (!options_.testing_skip_input_copy) {
      MCC_RETURN_IF_ERROR(static_batch_.tokens.CopyFrom(batch->tokens));
      MCC_RETURN_IF_ERROR(static_batch_.labels.CopyFrom(batch->labels));
      if (batch->loss_mask.defined()) {
        MCC_RETURN_IF_ERROR(static_batch_.loss_mask.CopyFrom(batch->loss_mask));
      }
    }
  }
  const bool captured_now = captured_record_ != nullptr;
  // A capture ran nothing: the forward runs now, from the static inputs.
  MCC_RETURN_IF_ERROR(forward_graph_.Replay());
  if (captured_now) {
    pending_ = Pending::kCaptured;
  } else {
    pending_ = Pending::kReplayed;
    ++stats_.replays;
  }
  parallel::StageOutput out;
  // The executor keeps every micro-batch's loss until the step ends; the
  // graph's output is overwritten by the next replay.
  out.loss_sum = static_loss_sum_.Clone();
  out.record = std::make_unique<GraphRecord>();
  return out;
}

absl::StatusOr<Tensor> GraphedStage::BackwardStep(
    const Tensor& output_grad, float grad_scale,
    std::unique_ptr<parallel::ActivationRecord> record) {
  const Pending pending = pending_;
  pending_ = Pending::kNone;
  switch (pending) {
    case Pending::kNone:
      return absl::FailedPreconditionError(
          "--cuda-graph stage: a backward without a forward");
    case Pending::kEager: {
      MCC_ASSIGN_OR_RETURN(
          Tensor dx,
          model_->BackwardStep(output_grad, grad_scale, std::move(record)));
      warmed_up_ = true;
      return dx;
    }
    case Pending::kCaptured: {
      absl::Status captured = CaptureBackward(grad_scale);
      if (!captured.ok()) {
        DropGraphs();
        return absl::Status(
            captured.code(),
            absl::StrCat("--cuda-graph: capturing the backward failed: ",
                         captured.message()));
      }
      break;
    }
    case Pending::kReplayed:
      if (grad_scale != backward_scale_) {
        // A new loss scale: this micro-batch again, eagerly (its inputs are
        // in the static tensors), and a new capture on the next.
        MicroBatch again = static_batch_;
        DropGraphs();
        ++stats_.rescaled;
        MCC_ASSIGN_OR_RETURN(parallel::StageOutput out, Eager(again));
        return model_->BackwardStep(output_grad, grad_scale,
                                    std::move(out.record));
      }
      break;
  }
  MCC_RETURN_IF_ERROR(backward_graph_.Replay());
  return Tensor();
}

}  // namespace gpt
}  // namespace mcc
