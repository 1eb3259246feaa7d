#include "core/ops/cuda/elementwise.h"
#include "core/ops/cuda/kernel_util.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GridFor;
using internal::kThreads;
using internal::Load;
using internal::Store;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

__device__ __forceinline__ float Gelu(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float GeluGrad(float x) {
  const float x2 = x * x;
  const float t = tanhf(kSqrt2OverPi * (x + kGeluCoeff * x * x2));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi *
                                 (1.0f + 3.0f * kGeluCoeff * x2);
}

template <typename T>
__global__ void GeluForwardKernel(const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    Store(y, i, Gelu(Load(x, i)));
  }
}

template <typename T>
__global__ void GeluBackwardKernel(const T* dy, const T* x, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    Store(dx, i, Load(dy, i) * GeluGrad(Load(x, i)));
  }
}

template <typename T>
__global__ void BiasAddKernel(const T* x, const T* bias, T* y, int64_t rows,
                              int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    Store(y, i, Load(x, i) + Load(bias, i % cols));
  }
}

// One block of 32 x 32 threads per 32 columns: each thread sums a strided
// set of rows of its column, then the 32 partial sums of a column are added
// in a fixed order. Deterministic.
template <typename T>
__global__ void BiasGradKernel(const T* dy, float* dbias, int64_t rows,
                               int64_t cols) {
  __shared__ float partial[32][33];
  const int64_t col = blockIdx.x * int64_t{32} + threadIdx.x;
  float acc = 0.0f;
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += 32)
      acc += Load(dy, r * cols + col);
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sum = 0.0f;
    for (int k = 0; k < 32; ++k) sum += partial[k][threadIdx.x];
    dbias[col] = sum;
  }
}

__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v,
                            uint16_t* param_bf16, int64_t n, float lr,
                            float beta1, float beta2, float eps,
                            float weight_decay, float bias_correction1,
                            float bias_correction2) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = grad[i];
    float p = param[i];
    p -= lr * weight_decay * p;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= lr * (mi / bias_correction1) / (sqrtf(vi / bias_correction2) + eps);
    param[i] = p;
    if (param_bf16 != nullptr) Store(param_bf16, i, p);
  }
}

template <typename S, typename D>
__global__ void ConvertKernel(const S* x, D* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    Store(y, i, Load(x, i));
  }
}

cudaError_t Launched() { return cudaGetLastError(); }

}  // namespace

cudaError_t GeluForwardF32(const float* x, float* y, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluForwardKernel<<<GridFor(n), kThreads, 0, stream>>>(x, y, n);
  return Launched();
}

cudaError_t GeluForwardBF16(const uint16_t* x, uint16_t* y, int64_t n,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluForwardKernel<<<GridFor(n), kThreads, 0, stream>>>(x, y, n);
  return Launched();
}

cudaError_t GeluBackwardF32(const float* dy, const float* x, float* dx,
                            int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(dy, x, dx, n);
  return Launched();
}

cudaError_t GeluBackwardBF16(const uint16_t* dy, const uint16_t* x,
                             uint16_t* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(dy, x, dx, n);
  return Launched();
}

cudaError_t BiasAddF32(const float* x, const float* bias, float* y,
                       int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  BiasAddKernel<<<GridFor(rows * cols), kThreads, 0, stream>>>(x, bias, y, rows,
                                                               cols);
  return Launched();
}

cudaError_t BiasAddBF16(const uint16_t* x, const uint16_t* bias, uint16_t* y,
                        int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  BiasAddKernel<<<GridFor(rows * cols), kThreads, 0, stream>>>(x, bias, y, rows,
                                                               cols);
  return Launched();
}

template <typename T>
static cudaError_t BiasGrad(const T* dy, float* dbias, int64_t rows,
                            int64_t cols, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  const dim3 block(32, 32);
  const dim3 grid(static_cast<unsigned int>((cols + 31) / 32));
  BiasGradKernel<<<grid, block, 0, stream>>>(dy, dbias, rows, cols);
  return Launched();
}

cudaError_t BiasGradF32(const float* dy, float* dbias, int64_t rows,
                        int64_t cols, cudaStream_t stream) {
  return BiasGrad(dy, dbias, rows, cols, stream);
}

cudaError_t BiasGradBF16(const uint16_t* dy, float* dbias, int64_t rows,
                         int64_t cols, cudaStream_t stream) {
  return BiasGrad(dy, dbias, rows, cols, stream);
}

cudaError_t AdamWStepF32(float* param, const float* grad, float* m, float* v,
                         uint16_t* param_bf16, int64_t n, float lr, float beta1,
                         float beta2, float eps, float weight_decay,
                         float bias_correction1, float bias_correction2,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AdamWKernel<<<GridFor(n), kThreads, 0, stream>>>(
      param, grad, m, v, param_bf16, n, lr, beta1, beta2, eps, weight_decay,
      bias_correction1, bias_correction2);
  return Launched();
}

cudaError_t F32ToBF16(const float* x, uint16_t* y, int64_t n,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(x, y, n);
  return Launched();
}

cudaError_t BF16ToF32(const uint16_t* x, float* y, int64_t n,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(x, y, n);
  return Launched();
}

}  // namespace cuda_kernels
}  // namespace mcc
