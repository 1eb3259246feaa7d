#include "training/model_batch.h"

namespace mcc {
namespace training {

gpt::MicroBatch ModelBatchOf(const data::MicroBatch& batch,
                             const data::LoaderConfig& config) {
  gpt::MicroBatch out;
  out.tokens = batch.tokens;
  out.labels = batch.labels;
  out.loss_mask = batch.loss_mask;
  out.document_start = batch.document_start;
  if (config.reset_position_ids && config.eod >= 0) {
    out.position_ids = batch.position_ids;
  }
  return out;
}

}  // namespace training
}  // namespace mcc
