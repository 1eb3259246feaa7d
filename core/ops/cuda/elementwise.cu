#include "core/ops/cuda/elementwise.h"
#include "core/ops/cuda/kernel_util.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;
using internal::kThreads;
using internal::LoadAs;
using internal::StoreAs;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

// tanhf: at most 2 ulp (CUDA Programming Guide, single-precision
// functions), the same on every device.
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

__global__ void GeluKernel(const void* x, ElemType xt, void* y, ElemType yt,
                           int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    StoreAs(y, yt, i, Gelu(LoadAs(x, xt, i)));
  }
}

__global__ void GeluBackwardKernel(const void* dy, ElemType dyt, const void* x,
                                   ElemType xt, void* dx, ElemType dxt,
                                   int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    StoreAs(dx, dxt, i, LoadAs(dy, dyt, i) * GeluGrad(LoadAs(x, xt, i)));
  }
}

__global__ void BiasAddKernel(const void* x, ElemType xt, const void* bias,
                              ElemType bt, void* y, ElemType yt, int64_t rows,
                              int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    StoreAs(y, yt, i, LoadAs(x, xt, i) + LoadAs(bias, bt, i % cols));
  }
}

__global__ void BiasGeluKernel(const void* x, ElemType xt, const void* bias,
                               ElemType bt, void* y, ElemType yt, int64_t rows,
                               int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    StoreAs(y, yt, i, Gelu(LoadAs(x, xt, i) + LoadAs(bias, bt, i % cols)));
  }
}

// The element (r, c) = i of a column sum: dy itself, or BiasGelu's fp32 dx.
struct PlainValue {
  const void* p;
  ElemType t;
  __device__ float operator()(int64_t i, int64_t) const {
    return LoadAs(p, t, i);
  }
};
struct BiasGeluGradValue {
  const void* dy;
  ElemType dyt;
  const void* x;
  ElemType xt;
  const void* bias;
  ElemType bt;
  __device__ float operator()(int64_t i, int64_t c) const {
    return LoadAs(dy, dyt, i) *
           GeluGrad(LoadAs(x, xt, i) + LoadAs(bias, bt, c));
  }
};

__global__ void BiasGeluBackwardKernel(BiasGeluGradValue v, void* dx,
                                       ElemType dxt, int64_t rows,
                                       int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    StoreAs(dx, dxt, i, v(i, i % cols));
  }
}

// One block of 32 x 32 threads per 32 columns: each thread sums a strided
// set of rows of its column, then the 32 partial sums of a column are added
// in a fixed order and the total added to dbias. Deterministic.
template <typename Value>
__global__ void ColumnSumKernel(Value value, float* dbias, int64_t rows,
                                int64_t cols) {
  __shared__ float partial[32][33];
  const int64_t col = blockIdx.x * int64_t{32} + threadIdx.x;
  float acc = 0.0f;
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += 32)
      acc += value(r * cols + col, col);
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sum = 0.0f;
    for (int k = 0; k < 32; ++k) sum += partial[k][threadIdx.x];
    dbias[col] += sum;
  }
}

// The explicit-rounding intrinsics keep nvcc from contracting a multiply and
// an add into an FMA, so each step rounds as the CPU kernel's does.
__device__ __forceinline__ void Sigmoid(float a, float* s, float* oms) {
  const float e = expf(-a);
  *s = 1.0f / (1.0f + e);
  *oms = e * *s;
}

__global__ void SwiGLUKernel(const void* x, ElemType xt, void* y, ElemType yt,
                             int64_t rows, int64_t h) {
  const int64_t n = rows * h;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t a_off = (i / h) * 2 * h + i % h;
    const float a = LoadAs(x, xt, a_off), b = LoadAs(x, xt, a_off + h);
    float s, oms;
    Sigmoid(a, &s, &oms);
    StoreAs(y, yt, i, a * s * b);
  }
}

__global__ void SwiGLUBackwardKernel(const void* dy, ElemType dyt,
                                     const void* x, ElemType xt, void* dx,
                                     ElemType dxt, int64_t rows, int64_t h) {
  const int64_t n = rows * h;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t a_off = (i / h) * 2 * h + i % h;
    const float a = LoadAs(x, xt, a_off), b = LoadAs(x, xt, a_off + h);
    const float g = LoadAs(dy, dyt, i);
    float s, oms;
    Sigmoid(a, &s, &oms);
    StoreAs(dx, dxt, a_off, g * b * s * (1.0f + a * oms));
    StoreAs(dx, dxt, a_off + h, g * a * s);
  }
}

__global__ void AdamWKernel(AdamWScalars s, const void* grad, ElemType gt,
                            float* param, float* m, float* v, void* param16,
                            ElemType p16t, int64_t n) {
  const float one_minus_b1 = __fsub_rn(1.0f, s.beta1);
  const float one_minus_b2 = __fsub_rn(1.0f, s.beta2);
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const float g = __fmul_rn(LoadAs(grad, gt, i), s.grad_scale);
    const float mi =
        __fadd_rn(__fmul_rn(s.beta1, m[i]), __fmul_rn(one_minus_b1, g));
    const float vi = __fadd_rn(__fmul_rn(s.beta2, v[i]),
                               __fmul_rn(__fmul_rn(one_minus_b2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float denom =
        __fadd_rn(__fmul_rn(__fsqrt_rn(vi), s.inv_sqrt_bc2), s.eps);
    const float p = __fsub_rn(__fmul_rn(param[i], s.decay),
                              __fdiv_rn(__fmul_rn(s.step_size, mi), denom));
    param[i] = p;
    if (param16 != nullptr) StoreAs(param16, p16t, i, p);
  }
}

__global__ void SgdKernel(SgdScalars s, const void* grad, ElemType gt,
                          float* param, float* buf, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    float d = LoadAs(grad, gt, i) * s.grad_scale + s.weight_decay * param[i];
    if (buf != nullptr) {
      buf[i] = s.first_step ? d : s.momentum * buf[i] + d;
      d = s.nesterov ? d + s.momentum * buf[i] : buf[i];
    }
    param[i] -= s.lr * d;
  }
}

__global__ void ConvertKernel(const void* x, ElemType xt, void* y, ElemType yt,
                              int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    StoreAs(y, yt, i, LoadAs(x, xt, i));
  }
}

__global__ void ConvertIntKernel(const void* x, ElemType xt, void* y,
                                 ElemType yt, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t v = xt == ElemType::kI32  ? static_cast<const int32_t*>(x)[i]
                      : xt == ElemType::kI8 ? static_cast<const int8_t*>(x)[i]
                                            : static_cast<const int64_t*>(x)[i];
    if (yt == ElemType::kI32) {
      static_cast<int32_t*>(y)[i] = static_cast<int32_t>(v);
    } else if (yt == ElemType::kI8) {
      static_cast<int8_t*>(y)[i] = static_cast<int8_t>(v);
    } else {
      static_cast<int64_t*>(y)[i] = v;
    }
  }
}

template <typename T>
__global__ void FillKernel(T* dst, T value, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) dst[i] = value;
}

__global__ void ScaleKernel(const void* x, ElemType xt, float alpha, void* y,
                            ElemType yt, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    StoreAs(y, yt, i, __fmul_rn(alpha, LoadAs(x, xt, i)));
  }
}

__global__ void AddKernel(const void* a, ElemType at, const void* b,
                          ElemType bt, void* y, ElemType yt, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    StoreAs(y, yt, i, __fadd_rn(LoadAs(a, at, i), LoadAs(b, bt, i)));
  }
}

__global__ void AccumulateKernel(const void* x, ElemType xt, float alpha,
                                 void* y, ElemType yt, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    StoreAs(y, yt, i, fmaf(alpha, LoadAs(x, xt, i), LoadAs(y, yt, i)));
  }
}

bool IsInt(ElemType t) {
  return t == ElemType::kI32 || t == ElemType::kI64 || t == ElemType::kI8;
}

cudaError_t Launched() { return cudaGetLastError(); }

}  // namespace

cudaError_t Gelu(const void* x, ElemType xt, void* y, ElemType yt, int64_t n,
                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluKernel<<<GridFor(n), kThreads, 0, stream>>>(x, xt, y, yt, n);
  return Launched();
}

cudaError_t GeluBackward(const void* dy, ElemType dyt, const void* x,
                         ElemType xt, void* dx, ElemType dxt, int64_t n,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(dy, dyt, x, xt, dx,
                                                          dxt, n);
  return Launched();
}

cudaError_t BiasAdd(const void* x, ElemType xt, const void* bias, ElemType bt,
                    void* y, ElemType yt, int64_t rows, int64_t cols,
                    cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  BiasAddKernel<<<GridFor(n), kThreads, 0, stream>>>(x, xt, bias, bt, y, yt,
                                                     rows, cols);
  return Launched();
}

template <typename Value>
cudaError_t ColumnSum(Value value, float* dbias, int64_t rows, int64_t cols,
                      cudaStream_t stream) {
  const dim3 block(32, 32);
  const dim3 grid(static_cast<unsigned int>((cols + 31) / 32));
  ColumnSumKernel<<<grid, block, 0, stream>>>(value, dbias, rows, cols);
  return Launched();
}

cudaError_t BiasGradAccumulate(const void* dy, ElemType dyt, float* dbias,
                               int64_t rows, int64_t cols,
                               cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  return ColumnSum(PlainValue{dy, dyt}, dbias, rows, cols, stream);
}

cudaError_t BiasGelu(const void* x, ElemType xt, const void* bias, ElemType bt,
                     void* y, ElemType yt, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  BiasGeluKernel<<<GridFor(n), kThreads, 0, stream>>>(x, xt, bias, bt, y, yt,
                                                      rows, cols);
  return Launched();
}

cudaError_t BiasGeluBackward(const void* dy, ElemType dyt, const void* x,
                             ElemType xt, const void* bias, ElemType bt,
                             void* dx, ElemType dxt, float* dbias, int64_t rows,
                             int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  const BiasGeluGradValue value{dy, dyt, x, xt, bias, bt};
  // The bias gradient first: dx may be dy, which the second kernel
  // overwrites.
  if (cudaError_t e = ColumnSum(value, dbias, rows, cols, stream);
      e != cudaSuccess) {
    return e;
  }
  BiasGeluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(value, dx, dxt,
                                                              rows, cols);
  return Launched();
}

cudaError_t SwiGLU(const void* x, ElemType xt, void* y, ElemType yt,
                   int64_t rows, int64_t h, cudaStream_t stream) {
  const int64_t n = rows * h;
  if (n == 0) return cudaSuccess;
  SwiGLUKernel<<<GridFor(n), kThreads, 0, stream>>>(x, xt, y, yt, rows, h);
  return Launched();
}

cudaError_t SwiGLUBackward(const void* dy, ElemType dyt, const void* x,
                           ElemType xt, void* dx, ElemType dxt, int64_t rows,
                           int64_t h, cudaStream_t stream) {
  const int64_t n = rows * h;
  if (n == 0) return cudaSuccess;
  SwiGLUBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(dy, dyt, x, xt, dx,
                                                            dxt, rows, h);
  return Launched();
}

cudaError_t AdamWStep(const AdamWScalars& s, const void* grad, ElemType gt,
                      float* param, float* m, float* v, void* param16,
                      ElemType p16t, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AdamWKernel<<<GridFor(n), kThreads, 0, stream>>>(s, grad, gt, param, m, v,
                                                   param16, p16t, n);
  return Launched();
}

cudaError_t SgdStep(const SgdScalars& s, const void* grad, ElemType gt,
                    float* param, float* buf, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SgdKernel<<<GridFor(n), kThreads, 0, stream>>>(s, grad, gt, param, buf, n);
  return Launched();
}

cudaError_t Convert(const void* src, ElemType st, void* dst, ElemType dt,
                    int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (IsInt(st) && IsInt(dt)) {
    ConvertIntKernel<<<GridFor(n), kThreads, 0, stream>>>(src, st, dst, dt, n);
  } else {
    ConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(src, st, dst, dt, n);
  }
  return Launched();
}

cudaError_t FillBits(void* dst, int elem_bytes, uint64_t bits, int64_t n,
                     cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (elem_bytes) {
    case 1:
      FillKernel<<<GridFor(n), kThreads, 0, stream>>>(
          static_cast<uint8_t*>(dst), static_cast<uint8_t>(bits), n);
      break;
    case 2:
      FillKernel<<<GridFor(n), kThreads, 0, stream>>>(
          static_cast<uint16_t*>(dst), static_cast<uint16_t>(bits), n);
      break;
    case 4:
      FillKernel<<<GridFor(n), kThreads, 0, stream>>>(
          static_cast<uint32_t*>(dst), static_cast<uint32_t>(bits), n);
      break;
    case 8:
      FillKernel<<<GridFor(n), kThreads, 0, stream>>>(
          static_cast<uint64_t*>(dst), bits, n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return Launched();
}

cudaError_t Scale(const void* x, ElemType xt, float alpha, void* y, ElemType yt,
                  int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<GridFor(n), kThreads, 0, stream>>>(x, xt, alpha, y, yt, n);
  return Launched();
}

cudaError_t Add(const void* a, ElemType at, const void* b, ElemType bt, void* y,
                ElemType yt, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<GridFor(n), kThreads, 0, stream>>>(a, at, b, bt, y, yt, n);
  return Launched();
}

cudaError_t Accumulate(const void* x, ElemType xt, float alpha, void* y,
                       ElemType yt, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AccumulateKernel<<<GridFor(n), kThreads, 0, stream>>>(x, xt, alpha, y, yt, n);
  return Launched();
}

}  // namespace cuda_kernels
}  // namespace mcc
