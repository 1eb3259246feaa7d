#include "training/model_chunks.h"

#include "core/status_macros.h"

namespace mcc {
namespace training {

ParameterList ChunkParameters(const ModelChunks& chunks) {
  ParameterList params;
  for (const ModelChunk* c : chunks) {
    params.insert(params.end(), c->parameters().begin(), c->parameters().end());
  }
  return params;
}

const std::vector<ParameterList>& ChunkUnits(const ModelChunk& chunk) {
  return chunk.units();
}

comm::ProcessGroup* ChunkTensorGroup(const ModelChunks& chunks) {
  return chunks.empty() ? nullptr : chunks[0]->context().tp_group;
}

void ZeroChunkGradients(const ModelChunks& chunks) {
  for (ModelChunk* c : chunks) c->ZeroGradients();
}

absl::Status SyncSharedGradients(const ModelChunks& chunks,
                                 comm::ProcessGroup* embedding_group) {
  for (ModelChunk* c : chunks) {
    MCC_RETURN_IF_ERROR(c->SyncSharedGradients(embedding_group));
  }
  return absl::OkStatus();
}

absl::Status FinalizeChunkGradients(const ModelChunks& chunks) {
  for (ModelChunk* c : chunks) MCC_RETURN_IF_ERROR(c->FinalizeGradients());
  return absl::OkStatus();
}

void SetGradReadyHook(const ModelChunks& chunks, GradReadyHook hook) {
  for (ModelChunk* c : chunks) c->SetGradReadyHook(hook);
}

void SetUnitHooks(ModelChunk* chunk, UnitHooks* hooks) {
  chunk->SetUnitHooks(hooks);
}

absl::StatusOr<LossSum> ForwardBackward(ModelChunk* chunk,
                                        const MicroBatch& batch,
                                        float grad_scale) {
  return chunk->ForwardBackward(batch, grad_scale);
}

absl::StatusOr<LossSum> Forward(ModelChunk* chunk, const MicroBatch& batch) {
  return chunk->Forward(batch);
}

}  // namespace training
}  // namespace mcc
