#ifndef INFERENCE_CHECKPOINT_WEIGHTS_H_
#define INFERENCE_CHECKPOINT_WEIGHTS_H_

// Loading a checkpoint's weights into model chunks for inference (eval,
// serve, the evaluation library): dense as stored, or weight-only int8
// (models/gpt/int8_quantization.h).
//
// A quantised checkpoint (models/gpt/int8_checkpoint_writer.h) is the sharded
// checkpoint format with, for each quantised weight W (global shape [..., in]),
// W's name holding int8 values of the same global shape and "<name>_scale"
// holding the fp32 scales (W's shape without its last dimension); every other
// model tensor is kept as stored, the optimizer's state is dropped, and the
// common state's extra map has quantization=int8. The scales are per global
// row, so the checkpoint loads under any tensor-parallel layout, and loading it
// gives exactly the int8 weights (bit for bit) that quantising the source
// checkpoint at load gives with the same parameter dtype.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint_reader.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/int8_checkpoint_writer.h"

namespace mcc {
namespace inference {

// Loads the chunks' weights for inference. A quantised checkpoint loads
// into int8 layers (with quantize "" or "int8"); otherwise the dense weights
// load and, with quantize "int8", "fp8" (E4M3, per-channel scales) or
// "fp8-per-tensor" (models/gpt/fp8_quantization.h), are then quantised
// (collective over each chunk's TP group). Any other quantize is
// InvalidArgument naming --quantize. On the logging rank, logs the
// quantised weights' memory before and after.
absl::Status LoadCheckpointWeights(CheckpointReader& reader,
                                   const std::vector<gpt::GPTModel*>& chunks,
                                   absl::string_view quantize, bool log);

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_CHECKPOINT_WEIGHTS_H_
