#ifndef MODELS_GPT_GRAPHED_STAGE_H_
#define MODELS_GPT_GRAPHED_STAGE_H_

// --cuda-graph for a GPT model that is a whole pipeline of its own (PP 1):
// a pipeline stage (parallel::PipelineStage) that runs a micro-batch's
// forward and backward as device graphs (core/graph_capture.h: CUDA graphs
// on GPUs, recorded kernel lists on the test device) once the shapes are
// static.
//
//   - The first training micro-batch runs eagerly (warm-up: allocator,
//     cuBLASLt plans, lazily built buffers).
//   - The next is captured: its forward (one graph) in ForwardStep, its
//     backward (another) in BackwardStep. Inputs come from static device
//     tensors (tokens, labels, loss mask), made as copies of that batch.
//   - Every later micro-batch of the same shapes copies its tensors into the
//     static ones (device-to-device) and replays the forward graph, then the
//     backward graph; gradients accumulate into main_grad exactly as eager
//     backwards do. Its loss sum is copied out of the graph's output at once
//     (the executor keeps every micro-batch's loss until the step's end).
//   - Another shape, or a loss mask present where the captured batch had
//     none (or the reverse), runs eagerly. A new grad_scale (a loss-scale
//     change) re-runs that micro-batch eagerly and captures again on the
//     next.
//   - Evaluation (ForwardStep without backward) runs eagerly, on the
//     micro-batches given to the model's own SetMicroBatches (as an
//     evaluation sets them), not on this stage's.
// Losses and gradients are those of the eager run, bit for bit: the same
// kernels run in the same order on the same addresses' contents.
//
// Labels are checked against the vocabulary (ops::CheckIndexRange, one
// read-back) before each replay, outside the graph; the model's own check
// inside the captured forward is skipped.
//
// What the model must not do inside the captured region (each is refused,
// at Create or by the capture, with an error naming --cuda-graph): dropout
// (its Philox offsets are host counters, frozen into the graph), activation
// offloading (side streams), tensor, context or pipeline parallelism
// (communication and p2p inside the graph), unit or grad-ready hooks that
// communicate or synchronise (data parallelism must reduce outside the
// captured region: no --overlap-grad-reduce / --overlap-param-gather).
// Unit and grad-ready hooks run during the eager and captured micro-batches
// only, not during replays.
//
// The model's dropout counter (rng_calls) advances only for eager and
// captured forwards; with dropout refused, that changes no mask.
//
// Not owned: the model, which must outlive this stage. One micro-batch in
// flight at a time (no pipelining: the forward of micro-batch i, then its
// backward); not thread-safe.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/graph_capture.h"
#include "core/tensor.h"
#include "models/gpt/gpt_model.h"
#include "parallel/model.h"

namespace mcc {
namespace gpt {

struct GraphedStageOptions {
  // For tests only: replays without copying the new micro-batch into the
  // static inputs (the fault the parity tests must catch).
  bool testing_skip_input_copy = false;
};

struct GraphedStageStats {
  int64_t eager_microbatches = 0;  // Warm-up, odd shapes, evaluation.
  int64_t captures = 0;            // Forward captures (a backward follows).
  int64_t replays = 0;             // Micro-batches replayed.
  // Replayed micro-batches whose backward then ran eagerly because
  // grad_scale had changed since the capture (counted in replays too).
  int64_t rescaled = 0;
};

class GraphedStage : public parallel::PipelineStage {
 public:
  // Errors (InvalidArgument naming --cuda-graph and the offending setting)
  // for a model that is not whole (pre and post process), has dropout,
  // activation offloading, TP or CP, or lives on a device without graph
  // capture (the CPU).
  static absl::StatusOr<std::unique_ptr<GraphedStage>> Create(
      GPTModel* model, GraphedStageOptions options = {});

  // The training micro-batches ForwardStep addresses by index. Also taken
  // from the model: a list given to the model's own SetMicroBatches (or
  // StageModel's, which stages host batches to the device) since this
  // stage last set the model's is adopted at the next training forward.
  void SetMicroBatches(std::shared_ptr<const std::vector<MicroBatch>> batches);
  absl::Status SetMicroBatches(std::vector<MicroBatch> batches);

  bool takes_batch_input() const override { return true; }
  bool computes_loss() const override { return true; }
  absl::StatusOr<parallel::TensorSpec> InputSpec(int microbatch) const override;
  absl::StatusOr<parallel::TensorSpec> OutputSpec(
      int microbatch) const override;
  absl::StatusOr<parallel::StageOutput> ForwardStep(
      int microbatch, const Tensor& input, bool backward_after) override;
  absl::StatusOr<Tensor> BackwardStep(
      const Tensor& output_grad, float grad_scale,
      std::unique_ptr<parallel::ActivationRecord> record) override;

  const GraphedStageStats& stats() const { return stats_; }
  GPTModel* model() const { return model_; }

 private:
  enum class Pending { kNone, kEager, kCaptured, kReplayed };

  GraphedStage(GPTModel* model, GraphedStageOptions options)
      : model_(model), options_(options) {}
  absl::StatusOr<const MicroBatch*> Batch(int microbatch) const;
  bool MatchesStatic(const MicroBatch& batch) const;
  absl::StatusOr<parallel::StageOutput> Eager(const MicroBatch& batch);
  absl::Status CaptureForward(const MicroBatch& batch);
  absl::Status CaptureBackward(float grad_scale);
  void DropGraphs();

  GPTModel* model_;
  GraphedStageOptions options_;
  void SetModelList(std::shared_ptr<const std::vector<MicroBatch>> list);

  std::shared_ptr<const std::vector<MicroBatch>> batches_;
  // The list this stage last gave the model (one micro-batch).
  std::shared_ptr<const std::vector<MicroBatch>> own_list_;
  GraphedStageStats stats_;
  bool warmed_up_ = false;
  Pending pending_ = Pending::kNone;
  // The captured micro-batch's static inputs, and what the graphs hold.
  MicroBatch static_batch_;
  Tensor static_loss_sum_;
  DeviceGraph forward_graph_;
  DeviceGraph backward_graph_;
  float backward_scale_ = 0.0f;
  // The captured forward's record, until the backward is captured from it.
  std::unique_ptr<parallel::ActivationRecord> captured_record_;
};

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_GRAPHED_STAGE_H_
