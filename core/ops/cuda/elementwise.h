// Launchers for the element-wise CUDA kernels of //core/ops/cuda:kernels.
// Raw device pointers, element counts and a stream; bf16 tensors are passed
// as uint16_t bit patterns (the layout of mcc::BFloat16). Each launcher
// returns the launch's cudaError_t (cudaGetLastError) and does not
// synchronise. Arithmetic is fp32.
#ifndef CORE_OPS_CUDA_ELEMENTWISE_H_
#define CORE_OPS_CUDA_ELEMENTWISE_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace mcc {
namespace cuda_kernels {

// GELU, tanh form: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
cudaError_t GeluForwardF32(const float* x, float* y, int64_t n,
                           cudaStream_t stream);
cudaError_t GeluForwardBF16(const uint16_t* x, uint16_t* y, int64_t n,
                            cudaStream_t stream);
// dx = dy * gelu'(x). dx may alias dy.
cudaError_t GeluBackwardF32(const float* dy, const float* x, float* dx,
                            int64_t n, cudaStream_t stream);
cudaError_t GeluBackwardBF16(const uint16_t* dy, const uint16_t* x,
                             uint16_t* dx, int64_t n, cudaStream_t stream);

// y[r, c] = x[r, c] + bias[c] for a row-major [rows, cols] x; y may alias x.
cudaError_t BiasAddF32(const float* x, const float* bias, float* y,
                       int64_t rows, int64_t cols, cudaStream_t stream);
cudaError_t BiasAddBF16(const uint16_t* x, const uint16_t* bias, uint16_t* y,
                        int64_t rows, int64_t cols, cudaStream_t stream);
// dbias[c] = sum over r of dy[r, c], accumulated in fp32 in a fixed order
// (deterministic). dbias is fp32.
cudaError_t BiasGradF32(const float* dy, float* dbias, int64_t rows,
                        int64_t cols, cudaStream_t stream);
cudaError_t BiasGradBF16(const uint16_t* dy, float* dbias, int64_t rows,
                         int64_t cols, cudaStream_t stream);

// One fused AdamW step on fp32 params, grads and moments (PyTorch's AdamW):
//   p -= lr * weight_decay * p
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p -= lr * (m / bias_correction1) / (sqrt(v / bias_correction2) + eps)
// with bias_correction{1,2} = 1 - beta{1,2}^step (pass 1 to disable). When
// param_bf16 is not null it also receives the updated params in bf16.
cudaError_t AdamWStepF32(float* param, const float* grad, float* m, float* v,
                         uint16_t* param_bf16, int64_t n, float lr, float beta1,
                         float beta2, float eps, float weight_decay,
                         float bias_correction1, float bias_correction2,
                         cudaStream_t stream);

// fp32 <-> bf16 (round to nearest even, NaN stays NaN).
cudaError_t F32ToBF16(const float* x, uint16_t* y, int64_t n,
                      cudaStream_t stream);
cudaError_t BF16ToF32(const uint16_t* x, float* y, int64_t n,
                      cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_ELEMENTWISE_H_
