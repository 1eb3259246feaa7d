#ifndef MODELS_GPT_INT8_CHECKPOINT_WRITER_H_
#define MODELS_GPT_INT8_CHECKPOINT_WRITER_H_

// Weight-only int8 checkpoints (models/gpt/int8_quantization.h): writing
// one, and telling one apart. Links no model code (convert_checkpoint).
//
// A quantised checkpoint is the sharded checkpoint format with, for each
// quantised weight W (global shape [..., in]), W's name holding int8 values
// of the same global shape and "<name>_scale" holding the fp32 scales
// (W's shape without its last dimension); every other model tensor is kept
// as stored, the optimizer's state is dropped, and the common state's extra
// map has quantization=int8. The scales are per global row, so the
// checkpoint loads under any tensor-parallel layout, and loading it gives
// exactly the int8 weights (bit for bit) that quantising the source
// checkpoint at load gives with the same parameter dtype.

#include <string>

#include "absl/status/status.h"
#include "checkpoint/checkpoint_reader.h"

namespace mcc {
namespace gpt {

// Whether the checkpoint holds int8 weights.
bool IsInt8Checkpoint(const CheckpointReader& reader);

// Writes the quantised form of `reader`'s checkpoint to `save_dir` (same
// iteration; world size 1). Single process. Errors: the source is already
// quantised, unreadable, or has a non-finite weight (named).
absl::Status WriteInt8Checkpoint(CheckpointReader& reader,
                                 const std::string& save_dir);

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_INT8_CHECKPOINT_WRITER_H_
