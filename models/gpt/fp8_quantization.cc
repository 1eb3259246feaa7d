#include "models/gpt/fp8_quantization.h"

#include "core/status_macros.h"

namespace mcc {
namespace gpt {

absl::Status QuantizeLinearWeightsFp8(GPTModel* model,
                                      ops::Fp8WeightScaling scaling) {
  for (int i = 0; i < model->num_local_layers(); ++i) {
    TransformerLayer* layer = model->layer(i);
    MCC_RETURN_IF_ERROR(layer->qkv()->ConvertToFp8(scaling));
    MCC_RETURN_IF_ERROR(layer->proj()->ConvertToFp8(scaling));
    MCC_RETURN_IF_ERROR(layer->fc1()->ConvertToFp8(scaling));
    MCC_RETURN_IF_ERROR(layer->fc2()->ConvertToFp8(scaling));
  }
  return absl::OkStatus();
}

Fp8WeightBytes CountFp8WeightBytes(GPTModel* model) {
  Fp8WeightBytes bytes;
  for (int i = 0; i < model->num_local_layers(); ++i) {
    const TransformerLayer* layer = model->layer(i);
    for (const parallel::Fp8Weight* w : {layer->qkv_fp8(), layer->proj_fp8(),
                                         layer->fc1_fp8(), layer->fc2_fp8()}) {
      if (w == nullptr) continue;
      bytes.code_bytes += w->q->value.nbytes();
      bytes.scale_bytes += w->scales->value.nbytes();
      bytes.bf16_bytes += w->q->value.numel() * 2;
    }
  }
  return bytes;
}

}  // namespace gpt
}  // namespace mcc
