#ifndef MODELS_GPT_FP8_QUANTIZATION_H_
#define MODELS_GPT_FP8_QUANTIZATION_H_

// Weight-only FP8 (E4M3) inference for a GPT model chunk (--quantize fp8):
// the same linear layers as weight-only int8 (models/gpt/int8_quantization.h:
// QKV, attention projection, fc1, fc2; not the embeddings, the output layer,
// norms or biases), each weight held as E4M3 codes, one byte a weight, with
// fp32 scales per output channel or one per tensor (core/ops/fp8_weight.h).
// The chunk then serves inference only: its forwards run the FP8 weight
// GEMM (emulated on the CPU: codes decoded exactly, fp32 sums), any backward
// fails, and the dense weights are released. Quantised at load only: there
// is no FP8 checkpoint.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/fp8_weight.h"
#include "models/gpt/gpt_model.h"

namespace mcc {
namespace gpt {

// Quantises the chunk's loaded weights. Collective over the chunk's TP group
// (row-parallel row maxima, and per tensor the maximum, are all-reduced), so
// every layout gets the serial model's codes and scales.
absl::Status QuantizeLinearWeightsFp8(GPTModel* model,
                                      ops::Fp8WeightScaling scaling);

// This rank's memory for the quantised layers' weights.
struct Fp8WeightBytes {
  int64_t code_bytes = 0;   // E4M3 codes: one byte a weight.
  int64_t scale_bytes = 0;  // fp32 scales.
  int64_t bf16_bytes = 0;   // The same weights in bf16.
};
Fp8WeightBytes CountFp8WeightBytes(GPTModel* model);

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_FP8_QUANTIZATION_H_
