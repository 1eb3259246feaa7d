#include "core/ops/cuda/int8_quantize.h"
#include "core/ops/cuda/kernel_util.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::BlockMax;
using internal::LoadAs;
using internal::RowThreads;

__device__ __forceinline__ void ReportBad(int64_t r, int64_t cols,
                                          int64_t last_bad,
                                          unsigned long long* bad) {
  if (last_bad >= 0) {
    atomicMin(bad, BadKey(r, last_bad, cols));
  }
}

// One block per row (grid-stride over rows). The maximum of non-negative
// values is the same in every order; fmaxf skips a NaN as the CPU's
// std::max(m, NaN) does (the result is unspecified then anyway).
__global__ void RowAbsMaxKernel(const void* w, ElemType wt, int64_t rows,
                                int64_t cols, float* absmax,
                                unsigned long long* bad) {
  __shared__ float scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float m = 0.0f;
    int64_t last_bad = -1;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float a = fabsf(LoadAs(w, wt, r * cols + c));
      if (!isfinite(a)) last_bad = c;
      m = fmaxf(m, a);
    }
    ReportBad(r, cols, last_bad, bad);
    m = BlockMax(m, scratch);
    if (threadIdx.x == 0) absmax[r] = m;
  }
}

__global__ void QuantizeRowsInt8Kernel(const void* w, ElemType wt,
                                       const float* absmax, int64_t rows,
                                       int64_t cols, int8_t* q, float* scales,
                                       unsigned long long* bad) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float m = absmax[r];
    const float s = __fdiv_rn(m, 127.0f);
    if (threadIdx.x == 0) scales[r] = s;
    int64_t last_bad = -1;
    int8_t* qr = q + r * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = LoadAs(w, wt, r * cols + c);
      if (s == 0.0f) {
        if (v != 0.0f) last_bad = c;
        qr[c] = 0;
        continue;
      }
      if (!(fabsf(v) <= m)) last_bad = c;  // Also NaN.
      // rintf: round to nearest, ties to even, as the CPU's nearbyint.
      const float t = rintf(__fdiv_rn(v, s));
      qr[c] = static_cast<int8_t>(fminf(127.0f, fmaxf(-127.0f, t)));
    }
    ReportBad(r, cols, last_bad, bad);
  }
}

unsigned int RowBlocks(int64_t rows) {
  return static_cast<unsigned int>(rows < 65536 ? (rows > 0 ? rows : 1)
                                                : 65536);
}

}  // namespace

cudaError_t RowAbsMax(const void* w, ElemType wt, int64_t rows, int64_t cols,
                      float* absmax, unsigned long long* bad,
                      cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(bad, 0xff, sizeof(*bad), stream);
  if (e != cudaSuccess || rows == 0) return e;
  RowAbsMaxKernel<<<RowBlocks(rows), RowThreads(cols), 0, stream>>>(
      w, wt, rows, cols, absmax, bad);
  return cudaGetLastError();
}

cudaError_t QuantizeRowsInt8(const void* w, ElemType wt, const float* absmax,
                             int64_t rows, int64_t cols, int8_t* q,
                             float* scales, unsigned long long* bad,
                             cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(bad, 0xff, sizeof(*bad), stream);
  if (e != cudaSuccess || rows == 0) return e;
  QuantizeRowsInt8Kernel<<<RowBlocks(rows), RowThreads(cols), 0, stream>>>(
      w, wt, absmax, rows, cols, q, scales, bad);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
