#include "models/gpt/stage_model.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "parallel/pipeline/schedules.h"

namespace mcc {
namespace gpt {

absl::StatusOr<std::unique_ptr<StageModel>> StageModel::Create(
    const GPTConfig& config, const parallel::LayerContext& context,
    const pipeline::PipelineConfig& split, int stage) {
  if (split.num_layers != config.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline split of ", split.num_layers,
                     " layers for a model of ", config.num_layers));
  }
  MCC_ASSIGN_OR_RETURN(std::vector<pipeline::LayerRange> ranges,
                       pipeline::StageLayers(split, stage));
  auto model = std::unique_ptr<StageModel>(new StageModel);
  const int p = split.pipeline_size;
  const int v = static_cast<int>(ranges.size());
  for (int i = 0; i < v; ++i) {
    ModelChunkSpec spec;
    spec.first_layer = ranges[i].first;
    spec.num_layers = ranges[i].count;
    const int virtual_stage =
        pipeline::VirtualStage(p, stage, i, split.v_shape);
    spec.pre_process = virtual_stage == 0;
    spec.post_process = virtual_stage == p * v - 1;
    spec.share_embedding_with_other_stage = p > 1;
    spec.embedding_copy_on_this_stage =
        p > 1 && pipeline::VirtualStage(p, stage, 0, split.v_shape) == 0 &&
        pipeline::VirtualStage(p, stage, v - 1, split.v_shape) == p * v - 1;
    MCC_ASSIGN_OR_RETURN(auto chunk, GPTModel::Create(config, context, spec));
    for (const auto& param : chunk->parameters()) {
      model->parameters_.push_back(param);
    }
    for (const auto& buffer : chunk->buffers()) {
      model->buffers_.push_back(buffer);
    }
    model->chunks_.push_back(std::move(chunk));
  }
  if (!context.device.is_cpu()) {
    model->staging_ = std::make_unique<PinnedStagingPool>(context.device);
  }
  return model;
}

std::vector<GPTModel*> StageModel::chunks() const {
  std::vector<GPTModel*> out;
  for (const auto& c : chunks_) out.push_back(c.get());
  return out;
}

std::vector<parallel::PipelineStage*> StageModel::stages() const {
  std::vector<parallel::PipelineStage*> out;
  for (const auto& c : chunks_) out.push_back(c.get());
  return out;
}

absl::Status StageModel::SetMicroBatches(std::vector<MicroBatch> batches) {
  if (staging_ != nullptr) {
    MCC_RETURN_IF_ERROR(staging_->Recycle());
    for (MicroBatch& b : batches) {
      for (Tensor* t : {&b.tokens, &b.labels, &b.loss_mask, &b.position_ids}) {
        if (t->defined() && t->device().is_cpu()) {
          MCC_ASSIGN_OR_RETURN(*t, staging_->Stage(*t));
        }
      }
    }
  }
  auto shared =
      std::make_shared<const std::vector<MicroBatch>>(std::move(batches));
  for (const auto& c : chunks_) c->SetMicroBatches(shared);
  return absl::OkStatus();
}

void StageModel::AddGradReadyHook(const parallel::GradReadyHook& hook) {
  for (const auto& c : chunks_) c->AddGradReadyHook(hook);
}

absl::Status StageModel::SyncSharedGradients(
    comm::ProcessGroup* embedding_group) {
  for (const auto& c : chunks_) {
    MCC_RETURN_IF_ERROR(c->SyncSharedGradients(embedding_group));
  }
  return absl::OkStatus();
}

absl::Status StageModel::FinalizeGradients() {
  for (const auto& c : chunks_) MCC_RETURN_IF_ERROR(c->FinalizeGradients());
  return absl::OkStatus();
}

void StageModel::ZeroGradients() {
  for (const auto& c : chunks_) c->ZeroGradients();
}

void StageModel::set_rng_calls(uint64_t calls) {
  for (const auto& c : chunks_) c->set_rng_calls(calls);
}

absl::StatusOr<std::vector<MoeLayerStats>> StageModel::TakeMoeStats() {
  std::vector<MoeLayerStats> out;
  for (const auto& chunk : chunks_) {
    MCC_ASSIGN_OR_RETURN(std::vector<MoeLayerStats> part,
                         chunk->TakeMoeStats());
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

absl::Status StageModel::UpdateExpertBias(comm::ProcessGroup* dp_group) {
  for (const auto& chunk : chunks_) {
    MCC_RETURN_IF_ERROR(chunk->UpdateExpertBias(dp_group));
  }
  return absl::OkStatus();
}

}  // namespace gpt
}  // namespace mcc
