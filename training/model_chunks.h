#ifndef TRAINING_MODEL_CHUNKS_H_
#define TRAINING_MODEL_CHUNKS_H_

// The trainer's whole view of the model: this rank's model chunks (the whole
// model, one pipeline stage, or one chunk per virtual stage, in order), the
// micro-batch and loss types, and the few calls below. This header and its
// .cc are the only files of //training that name the GPT; a model contract
// in //parallel replaces the aliases and the calls one for one.
//
// None of these functions takes ownership; chunks must outlive the calls.
// Calls marked collective must be made by every rank of the named group, in
// the same order. Not thread-safe: one thread drives a model.

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/parameter.h"
#include "models/gpt/gpt_model.h"

namespace mcc {
namespace training {

using MicroBatch = gpt::MicroBatch;
using LossSum = gpt::LossSum;
using ModelChunk = gpt::GPTModel;
using ModelChunks = std::vector<ModelChunk*>;
using UnitHooks = gpt::UnitHooks;
using GradReadyHook =
    std::function<absl::Status(const std::vector<Parameter*>& ready)>;

// Every chunk's parameters, chunk by chunk (the data-parallel order).
ParameterList ChunkParameters(const ModelChunks& chunks);
// A chunk's parameters per unit, in forward order (see UnitHooks).
const std::vector<ParameterList>& ChunkUnits(const ModelChunk& chunk);
// The tensor-parallel group the chunks were built over (may be null).
comm::ProcessGroup* ChunkTensorGroup(const ModelChunks& chunks);

void ZeroChunkGradients(const ModelChunks& chunks);
// Sums the tied embedding / output weight's gradient over `embedding_group`
// (the first and last pipeline stages; null: nothing to sum) and reports it
// ready to the grad-ready hook. Collective over embedding_group.
absl::Status SyncSharedGradients(const ModelChunks& chunks,
                                 comm::ProcessGroup* embedding_group);
// Sums over TP the gradients sequence parallelism leaves partial.
// Collective over the chunks' tensor-parallel group.
absl::Status FinalizeChunkGradients(const ModelChunks& chunks);

void SetGradReadyHook(const ModelChunks& chunks, GradReadyHook hook);
void SetUnitHooks(ModelChunk* chunk, UnitHooks* hooks);

// One micro-batch through a whole-model chunk: parameters' main_grad
// accumulate d(mean loss)/dparam * grad_scale. Collective over TP.
absl::StatusOr<LossSum> ForwardBackward(ModelChunk* chunk,
                                        const MicroBatch& batch,
                                        float grad_scale);
// Forward only, no dropout (evaluation). Collective over TP.
absl::StatusOr<LossSum> Forward(ModelChunk* chunk, const MicroBatch& batch);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_MODEL_CHUNKS_H_
