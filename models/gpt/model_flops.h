#ifndef MODELS_GPT_MODEL_FLOPS_H_
#define MODELS_GPT_MODEL_FLOPS_H_

#include "models/gpt/gpt_config.h"

namespace mcc {
namespace gpt {

// Model FLOPs of one training token (forward and backward, 3x forward, no
// recomputation) as Megatron counts them for MFU: the GEMMs of every layer
// (QKV, output projection, MLP in and out), attention scores and weighted
// values over the full sequence, and the output layer. train's MFU and
// tools/plan's step-time model both count with it.
double TrainingFlopsPerToken(const GPTConfig& config);

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_MODEL_FLOPS_H_
