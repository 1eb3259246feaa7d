// Launchers for the element-wise CUDA kernels of //core/ops/cuda:kernels.
//
// Pointers are device pointers of the element type named beside each
// (elem_type.h); floats of any type are loaded as fp32, the arithmetic is
// fp32, and each result is rounded once to its output's type (to nearest
// even). Each launcher enqueues its work on `stream`, returns the launch's
// cudaError_t (cudaGetLastError) and never synchronises. Callers (the
// registrations, registrations.cc) have validated shapes, dtypes and
// aliasing: an output may be an input itself only where stated.
#ifndef CORE_OPS_CUDA_ELEMENTWISE_H_
#define CORE_OPS_CUDA_ELEMENTWISE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// GELU, tanh form: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and
// its gradient dx = dy * gelu'(x). Outputs overwritten; y may be x, dx may be
// dy (same type).
cudaError_t Gelu(const void* x, ElemType xt, void* y, ElemType yt, int64_t n,
                 cudaStream_t stream);
cudaError_t GeluBackward(const void* dy, ElemType dyt, const void* x,
                         ElemType xt, void* dx, ElemType dxt, int64_t n,
                         cudaStream_t stream);

// Megatron's bias_gelu fusion: y = gelu(x + bias) over row-major
// [rows, cols] (x + bias rounded once in fp32); y may be x. The backward:
// dx = dy * gelu'(x + bias), overwritten (dx may be dy), and dbias[c] +=
// the column sums of the unrounded fp32 dx (deterministic order).
cudaError_t BiasGelu(const void* x, ElemType xt, const void* bias, ElemType bt,
                     void* y, ElemType yt, int64_t rows, int64_t cols,
                     cudaStream_t stream);
cudaError_t BiasGeluBackward(const void* dy, ElemType dyt, const void* x,
                             ElemType xt, const void* bias, ElemType bt,
                             void* dx, ElemType dxt, float* dbias, int64_t rows,
                             int64_t cols, cudaStream_t stream);

// SwiGLU over x [rows, 2h] = [a, b]: y [rows, h] = silu(a) * b with
// silu(a) = a sigmoid(a); the backward dx [rows, 2h] = [dy * b * silu'(a),
// dy * silu(a)], overwritten (dx may be x). sigmoid(a) = 1 / (1 + e),
// e = expf(-a), and 1 - sigmoid(a) = e sigmoid(a) (no cancellation).
cudaError_t SwiGLU(const void* x, ElemType xt, void* y, ElemType yt,
                   int64_t rows, int64_t h, cudaStream_t stream);
cudaError_t SwiGLUBackward(const void* dy, ElemType dyt, const void* x,
                           ElemType xt, void* dx, ElemType dxt, int64_t rows,
                           int64_t h, cudaStream_t stream);

// y[r, c] = x[r, c] + bias[c] for row-major [rows, cols]; y may be x.
cudaError_t BiasAdd(const void* x, ElemType xt, const void* bias, ElemType bt,
                    void* y, ElemType yt, int64_t rows, int64_t cols,
                    cudaStream_t stream);
// dbias[c] += sum over r of dy[r, c] (dbias fp32), each column summed in
// fp32 in a fixed order (deterministic).
cudaError_t BiasGradAccumulate(const void* dy, ElemType dyt, float* dbias,
                               int64_t rows, int64_t cols, cudaStream_t stream);

// The scalars of one AdamW step, computed on the host exactly as the CPU
// kernel computes them (core/ops/adamw.cc).
struct AdamWScalars {
  float step_size = 0;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(1 - beta2^step)
  float decay = 0;         // 1 - lr * weight_decay
  float beta1 = 0, beta2 = 0, eps = 0, grad_scale = 0;
};
// In place on fp32 param, m, v (n elements), with the CPU kernel's operation
// order and IEEE rounding at every step (no contraction into FMAs):
//   g = grad * grad_scale; m = beta1 m + (1 - beta1) g;
//   v = beta2 v + (1 - beta2) g g;
//   param = param * decay - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
// and param16 (when not null, bf16 or fp16) = param rounded.
cudaError_t AdamWStep(const AdamWScalars& s, const void* grad, ElemType gt,
                      float* param, float* m, float* v, void* param16,
                      ElemType p16t, int64_t n, cudaStream_t stream);

// One SGD step with momentum (core/ops/sgd.h), in place on fp32 param and
// buf (null without momentum), in the CPU kernel's order:
//   d = grad * grad_scale + weight_decay * param;
//   buf = first_step ? d : momentum * buf + d;
//   d = nesterov ? d + momentum * buf : buf;  param -= lr * d.
// Either compiler may contract a product and a sum into an FMA.
struct SgdScalars {
  float lr = 0, momentum = 0, weight_decay = 0, grad_scale = 0;
  bool nesterov = false, first_step = false;
};
cudaError_t SgdStep(const SgdScalars& s, const void* grad, ElemType gt,
                    float* param, float* buf, int64_t n, cudaStream_t stream);

// dst = src converted element by element, any two types (floats round to
// nearest even; floats to integers truncate toward zero, saturating where
// the CPU's result is undefined; integers to integers keep 64 bits). src
// and dst do not overlap.
cudaError_t Convert(const void* src, ElemType st, void* dst, ElemType dt,
                    int64_t n, cudaStream_t stream);

// n elements of elem_bytes (2, 4 or 8) each set to the low bytes of `bits`.
cudaError_t FillBits(void* dst, int elem_bytes, uint64_t bits, int64_t n,
                     cudaStream_t stream);

// y = alpha * x (y may be x); y = a + b (y may be a or b); y += alpha * x as
// fmaf(alpha, x, y) (y apart from x). Floats only.
cudaError_t Scale(const void* x, ElemType xt, float alpha, void* y, ElemType yt,
                  int64_t n, cudaStream_t stream);
cudaError_t Add(const void* a, ElemType at, const void* b, ElemType bt, void* y,
                ElemType yt, int64_t n, cudaStream_t stream);
cudaError_t Accumulate(const void* x, ElemType xt, float alpha, void* y,
                       ElemType yt, int64_t n, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_ELEMENTWISE_H_
