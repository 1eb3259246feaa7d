#ifndef PARALLEL_TESTING_MLP_STACK_H_
#define PARALLEL_TESTING_MLP_STACK_H_

// A model that is not the GPT, for tests of the parallel libraries through
// the model contract (parallel/model.h) alone: if it trains under data,
// sharded-data and pipeline parallelism, those libraries depend on nothing
// of the GPT. Start here to see what a model must provide.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "parallel/linear.h"
#include "parallel/mlp_block.h"
#include "parallel/model.h"

namespace mcc {
namespace parallel {
namespace testing {

struct MlpStackConfig {
  int num_blocks = 4;
  int64_t hidden = 16;      // Width of the residual stream.
  int64_t ffn_hidden = 32;  // Width inside a block (split over TP).
};

// One micro-batch of a regression task: fp32 inputs and targets, both
// [rows, hidden].
struct MlpBatch {
  Tensor inputs;
  Tensor targets;
};

// Micro-batch `index` of step `step`: `rows` rows whose targets are a fixed
// smooth function of the inputs, so the loss can fall. Deterministic.
MlpBatch MakeMlpBatch(const MlpStackConfig& config, int step, int index,
                      int64_t rows = 8);

// A stack of residual MLP blocks, block i computing
//   x + fc2_i(gelu(fc1_i(x)))
// (parallel/mlp_block.h: fc1 a ColumnParallelLinear [hidden -> ffn_hidden],
// fc2 a RowParallelLinear [ffn_hidden -> hidden]), and the loss
//   sum over rows of 0.5 * |x - target|^2, counted per row.
// One object holds blocks [first_block, first_block + num_blocks) of a
// config.num_blocks stack: the whole model or one pipeline stage. Parameters
// are named after their global block, so every split starts from the same
// weights. Units: one per block. fp32 only; no sequence parallelism.
//
// Not thread-safe; as the contract says.
class MlpStack : public Model, public PipelineStage {
 public:
  static absl::StatusOr<std::unique_ptr<MlpStack>> Create(
      const MlpStackConfig& config, const LayerContext& context,
      int first_block, int num_blocks);

  // The micro-batches the pipeline steps address by index.
  void SetMicroBatches(std::shared_ptr<const std::vector<MlpBatch>> batches) {
    batches_ = std::move(batches);
  }

  // Model.
  const ParameterList& parameters() const override { return parameters_; }
  const std::vector<ParameterList>& units() const override { return units_; }
  comm::ProcessGroup* tensor_group() const override {
    return context_.tp_group;
  }

  // PipelineStage: the residual stream [rows, hidden] fp32 on the batch's
  // device (a test may move the parameters and batches to another device)
  // passes between stages.
  bool takes_batch_input() const override { return first_block_ == 0; }
  bool computes_loss() const override {
    return first_block_ + num_blocks() == config_.num_blocks;
  }
  absl::StatusOr<TensorSpec> InputSpec(int microbatch) const override;
  absl::StatusOr<TensorSpec> OutputSpec(int microbatch) const override;
  absl::StatusOr<StageOutput> ForwardStep(int microbatch, const Tensor& input,
                                          bool backward_after) override;
  absl::StatusOr<Tensor> BackwardStep(
      const Tensor& output_grad, float grad_scale,
      std::unique_ptr<ActivationRecord> record) override;
  // Split: B leaves the blocks' weight gradients, and their units' hooks,
  // in the record for W.
  absl::StatusOr<Tensor> BackwardInputStep(
      const Tensor& output_grad, float grad_scale,
      std::unique_ptr<ActivationRecord>* record) override;
  absl::Status BackwardWeightStep(
      std::unique_ptr<ActivationRecord> record) override;

  int num_blocks() const { return static_cast<int>(blocks_.size()); }

 private:
  struct Record;

  MlpStack() = default;
  absl::StatusOr<const MlpBatch*> Batch(int microbatch) const;
  // The backward; with `deferred` the input-gradient step of the split.
  absl::StatusOr<Tensor> Backward(const Tensor& output_grad, float grad_scale,
                                  ActivationRecord* record,
                                  DeferredWeightGrads* deferred);

  MlpStackConfig config_;
  LayerContext context_;
  int first_block_ = 0;
  std::vector<MlpBlock> blocks_;
  ParameterList parameters_;
  std::vector<ParameterList> units_;
  std::shared_ptr<const std::vector<MlpBatch>> batches_;
};

// One rank's chunks of a config.num_blocks stack split over `stages`
// pipeline stages of `virtual_stages` chunks each: its chunk v holds model
// chunk v * stages + stage, as interleaving assigns them (one chunk, the
// whole stack, when both are 1).
struct MlpStackChunks {
  std::vector<std::unique_ptr<MlpStack>> chunks;
  std::vector<PipelineStage*> stages;  // The chunks, for the executor.
  std::vector<Model*> models;          // The chunks, for the step.
  ParameterList parameters;            // Every chunk's, in order.
};
absl::StatusOr<MlpStackChunks> CreateMlpStackChunks(
    const MlpStackConfig& config, const LayerContext& context, int stages,
    int stage, int virtual_stages);

}  // namespace testing
}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_TESTING_MLP_STACK_H_
