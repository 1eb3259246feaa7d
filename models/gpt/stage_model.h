#ifndef MODELS_GPT_STAGE_MODEL_H_
#define MODELS_GPT_STAGE_MODEL_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/parameter.h"
#include "core/pinned_staging_pool.h"
#include "models/gpt/gpt_model.h"
#include "parallel/model.h"
#include "parallel/pipeline/layer_split.h"

namespace mcc {
namespace gpt {

// The part of a GPT one pipeline stage holds: one model chunk, or one per
// virtual stage. With tied embeddings and more than one stage, the first
// stage's word embedding and the last stage's output weight are two copies
// of one parameter, kept equal by summing their gradients.
class StageModel {
 public:
  // The chunks of `stage` (config.num_layers must equal split.num_layers).
  static absl::StatusOr<std::unique_ptr<StageModel>> Create(
      const GPTConfig& config, const parallel::LayerContext& context,
      const pipeline::PipelineConfig& split, int stage);

  std::vector<GPTModel*> chunks() const;
  // The chunks as the pipeline executor takes them.
  std::vector<parallel::PipelineStage*> stages() const;
  GPTModel* chunk(int i) const { return chunks_[i].get(); }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  // Every chunk's parameters, chunk by chunk.
  const ParameterList& parameters() const { return parameters_; }
  // Every chunk's checkpoint buffers (GPTModel::buffers), chunk by chunk.
  const ParameterList& buffers() const { return buffers_; }
  // Every chunk's GPTModel::TakeMoeStats, in layer order.
  absl::StatusOr<std::vector<MoeLayerStats>> TakeMoeStats();
  // Every chunk's GPTModel::UpdateExpertBias (collective over dp_group).
  absl::Status UpdateExpertBias(comm::ProcessGroup* dp_group);

  // The micro-batches of the next pipeline step (every chunk's). On a
  // device that is not the host, CPU tensors among them (the data loader's)
  // go to the device through pinned staging buffers, asynchronously on the
  // device's current stream (core/pinned_staging_pool.h); the buffers of
  // the previous call are recycled first, which waits for the stream (by
  // then idle but for the last step's optimizer update). Errors: a failed
  // copy or pinned allocation.
  absl::Status SetMicroBatches(std::vector<MicroBatch> batches);
  // Installs `hook` on every chunk (for the model's lifetime).
  void AddGradReadyHook(const parallel::GradReadyHook& hook);
  // Sums the shared embedding gradients over `embedding_group` (null or a
  // stage without them: nothing); call after the schedule, before the
  // data-parallel gradient sync.
  absl::Status SyncSharedGradients(comm::ProcessGroup* embedding_group);
  // Each chunk's FinalizeGradients (after the data-parallel sync).
  absl::Status FinalizeGradients();
  void ZeroGradients();
  // The dropout stream position (every chunk advances it alike).
  uint64_t rng_calls() const { return chunks_[0]->rng_calls(); }
  void set_rng_calls(uint64_t calls);

 private:
  std::vector<std::unique_ptr<GPTModel>> chunks_;
  ParameterList parameters_;
  ParameterList buffers_;
  // Off the host: stages the micro-batches to the chunks' device.
  std::unique_ptr<PinnedStagingPool> staging_;
};

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_STAGE_MODEL_H_
