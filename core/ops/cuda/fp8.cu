#include "core/ops/cuda/fp8.h"
#include "core/ops/cuda/kernel_util.cuh"
// After CUDA's headers: the bodies use its keywords.
#include "core/ops/cuda/fp8_kernels.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::LoadAs;
using internal::StoreAs;

constexpr int kThreads = 256;  // A power of two (MaxBitsBlock's tree).
constexpr int kMaxBlocks = 1024;

struct TypedLoad {
  const void* p;
  ElemType t;
  __device__ float operator()(int64_t i) const { return LoadAs(p, t, i); }
};

struct TypedStore {
  void* p;
  ElemType t;
  __device__ void operator()(int64_t i, float v) const { StoreAs(p, t, i, v); }
};

struct AbsBitsOf {
  const void* p;
  ElemType t;
  __device__ uint32_t operator()(int64_t i) const {
    return fp8::AbsBits(LoadAs(p, t, i));
  }
};

struct WordsOf {
  const uint32_t* p;
  __device__ uint32_t operator()(int64_t i) const { return p[i]; }
};

template <typename Bits>
__global__ void MaxBitsKernel(Bits bits, int64_t n, uint32_t* out) {
  extern __shared__ uint32_t scratch[];
  fp8::MaxBitsBlock(bits, n, scratch, out);
}

__global__ void CastKernel(TypedLoad load, TypedStore store, const float* scale,
                           fp8::Format fmt, int64_t n) {
  fp8::CastRange(load, store, scale, fmt, n);
}

__global__ void CastBytesKernel(TypedLoad load, uint8_t* out,
                                const float* scale, fp8::Format fmt,
                                int64_t rows, int64_t cols, bool transpose) {
  fp8::CastBytesRange(load, out, scale, fmt, rows, cols, transpose);
}

__global__ void ScaleInversesKernel(const float* first, const float* second,
                                    float* out) {
  if (threadIdx.x == 0) {
    out[0] = __fdiv_rn(1.0f, first[0]);
    out[1] = __fdiv_rn(1.0f, second[0]);
  }
}

__global__ void DequantizeKernel(const float* sum, const float* sa,
                                 const float* sb, float alpha, float beta,
                                 void* c, ElemType ct, int64_t n) {
  // alpha * (1 / sa) * (1 / sb), each step rounded, as the CPU kernel.
  const float f = __fmul_rn(__fmul_rn(alpha, __fdiv_rn(1.0f, sa[0])),
                            __fdiv_rn(1.0f, sb[0]));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    float v = __fmul_rn(f, sum[i]);
    if (beta != 0.0f) v = __fadd_rn(v, __fmul_rn(beta, LoadAs(c, ct, i)));
    StoreAs(c, ct, i, v);
  }
}

unsigned int BlocksFor(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(b < 1 ? 1
                                         : (b > kMaxBlocks ? kMaxBlocks : b));
}

}  // namespace

int AbsMaxBlocks(int64_t n) { return static_cast<int>(BlocksFor(n)); }

cudaError_t AbsMax(const void* x, ElemType xt, int64_t n, uint32_t* partial,
                   float* amax, cudaStream_t stream) {
  const unsigned int blocks = BlocksFor(n);
  const size_t shared = kThreads * sizeof(uint32_t);
  MaxBitsKernel<<<blocks, kThreads, shared, stream>>>(AbsBitsOf{x, xt}, n,
                                                      partial);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  // The float's bits are the maximum's bits.
  MaxBitsKernel<<<1, kThreads, shared, stream>>>(
      WordsOf{partial}, blocks, reinterpret_cast<uint32_t*>(amax));
  return cudaGetLastError();
}

cudaError_t CastToFp8Values(const void* x, ElemType xt, const float* scale,
                            bool e5m2, void* out, ElemType out_t, int64_t n,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CastKernel<<<BlocksFor(n), kThreads, 0, stream>>>(
      TypedLoad{x, xt}, TypedStore{out, out_t}, scale,
      e5m2 ? fp8::E5M2() : fp8::E4M3(), n);
  return cudaGetLastError();
}

cudaError_t CastToFp8Bytes(const void* x, ElemType xt, const float* scale,
                           bool e5m2, uint8_t* out, int64_t rows, int64_t cols,
                           bool transpose, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  CastBytesKernel<<<BlocksFor(rows * cols), kThreads, 0, stream>>>(
      TypedLoad{x, xt}, out, scale, e5m2 ? fp8::E5M2() : fp8::E4M3(), rows,
      cols, transpose);
  return cudaGetLastError();
}

cudaError_t Fp8ScaleInverses(const float* first, const float* second,
                             float* out, cudaStream_t stream) {
  ScaleInversesKernel<<<1, 32, 0, stream>>>(first, second, out);
  return cudaGetLastError();
}

cudaError_t Fp8Dequantize(const float* sum, const float* sa, const float* sb,
                          float alpha, float beta, void* c, ElemType ct,
                          int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  DequantizeKernel<<<BlocksFor(n), kThreads, 0, stream>>>(sum, sa, sb, alpha,
                                                          beta, c, ct, n);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
