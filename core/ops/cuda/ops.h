// Tensor-level CUDA ops: validate devices, dtypes and shapes (errors name the
// op and the tensors, e.g. "LayerNormForward: gamma must be fp32[768], got
// fp32[767] on cuda:0"), then launch the kernels of //core/ops/cuda:kernels
// on the device's current stream (core/cuda/stream.h). Nothing synchronises:
// results are ready once the stream reaches them; copies to the host wait.
//
// Floating tensors are fp32 or bf16 (arithmetic in fp32); outputs match the
// input dtype unless stated. All tensors of one call live on one device.
#ifndef CORE_OPS_CUDA_OPS_H_
#define CORE_OPS_CUDA_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {
namespace cuda {

// GELU (tanh form) of any-shaped x, and its gradient dx = dy * gelu'(x).
absl::StatusOr<Tensor> GeluForward(const Tensor& x);
absl::StatusOr<Tensor> GeluBackward(const Tensor& dy, const Tensor& x);

// x [..., n] + bias [n] (bias of x's dtype), and the bias gradient: the sum
// of dy [..., n] over all leading dimensions, as fp32 [n].
absl::StatusOr<Tensor> BiasAdd(const Tensor& x, const Tensor& bias);
absl::StatusOr<Tensor> BiasGrad(const Tensor& dy);

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  bool bias_correction = true;
};

// One AdamW step (step counts from 1) on fp32 param, grad, m, v of one shape,
// updated in place. When model_param is given (bf16, same shape) it receives
// the updated params in bf16.
absl::Status AdamWStep(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                       const AdamWConfig& config, int64_t step,
                       Tensor* model_param = nullptr);

// fp32 <-> bf16 (round to nearest even); the same dtype gives a copy.
absl::StatusOr<Tensor> Convert(const Tensor& x, DType dtype);

// LayerNorm over the last dimension of x [..., n] with fp32 gamma, beta [n].
struct LayerNormOutput {
  Tensor y;     // like x
  Tensor mean;  // fp32 [rows], rows = numel / n
  Tensor rstd;  // fp32 [rows]
};
absl::StatusOr<LayerNormOutput> LayerNormForward(const Tensor& x,
                                                 const Tensor& gamma,
                                                 const Tensor& beta, float eps);
struct LayerNormGrads {
  Tensor dx;      // like x
  Tensor dgamma;  // fp32 [n]
  Tensor dbeta;   // fp32 [n]
};
absl::StatusOr<LayerNormGrads> LayerNormBackward(const Tensor& dy,
                                                 const Tensor& x,
                                                 const Tensor& gamma,
                                                 const Tensor& mean,
                                                 const Tensor& rstd);

// Softmax cross-entropy of logits [..., vocab] against int64 labels [...]:
// per-row losses (fp32, 0 where label == ignore_index, NaN for a label out
// of range) and the row log-sum-exp saved for the backward.
struct CrossEntropyOutput {
  Tensor loss;  // fp32, labels' shape
  Tensor lse;   // fp32, labels' shape
};
absl::StatusOr<CrossEntropyOutput> SoftmaxCrossEntropyForward(
    const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100);
// dlogits (like logits) for per-row upstream gradients dloss (fp32, labels'
// shape).
absl::StatusOr<Tensor> SoftmaxCrossEntropyBackward(const Tensor& dloss,
                                                   const Tensor& logits,
                                                   const Tensor& labels,
                                                   const Tensor& lse,
                                                   int64_t ignore_index = -100);

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_OPS_H_
