#ifndef TRAINING_MODEL_BATCH_H_
#define TRAINING_MODEL_BATCH_H_

#include "data/loader.h"
#include "models/gpt/gpt_model.h"

namespace mcc {
namespace training {

// The model's micro-batch of a loader's: tokens, labels and loss mask, the
// document starts when the loader found them (--reset-attention-mask), and
// the positions when it restarted them at each document
// (--reset-position-ids; otherwise the model counts 0, 1, ... itself).
gpt::MicroBatch ModelBatchOf(const data::MicroBatch& batch,
                             const data::LoaderConfig& config);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_MODEL_BATCH_H_
