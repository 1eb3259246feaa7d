#include "core/ops/cuda/int8_gemm.h"
#include "core/ops/cuda/kernel_util.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::LoadAs;
using internal::StoreAs;

constexpr int kTile = 32;          // Outputs per block side, and k per panel.
constexpr int kRowsPerThread = 4;  // kTile / (threads per block / kTile).
constexpr int kThreadRows = kTile / kRowsPerThread;

// Block (kTile, kThreadRows) threads; blockIdx.x tiles n, blockIdx.y (with a
// stride) tiles m. Thread (tx, ty) computes rows ty + kThreadRows * r of the
// tile in column tx. Out-of-range elements load as zeros but are never
// summed (columns past k) or stored (rows past m or n).
__global__ void Int8GemmKernel(const void* x, ElemType xt, const int8_t* q,
                               const float* scales, void* y, ElemType yt,
                               int64_t m, int64_t n, int64_t k) {
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float qs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t j = n0 + tx;
  for (int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTile; m0 < m;
       m0 += static_cast<int64_t>(gridDim.y) * kTile) {
    float acc[kRowsPerThread] = {};
    for (int64_t p0 = 0; p0 < k; p0 += kTile) {
      // Each thread loads kRowsPerThread elements of each panel; a warp
      // reads 32 consecutive elements of one row (coalesced).
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int row = ty + kThreadRows * r;
        const int64_t p = p0 + tx;
        const int64_t xi = m0 + row, qj = n0 + row;
        xs[row][tx] = (xi < m && p < k) ? LoadAs(x, xt, xi * k + p) : 0.0f;
        qs[row][tx] =
            (qj < n && p < k) ? static_cast<float>(q[qj * k + p]) : 0.0f;
      }
      __syncthreads();
      const int64_t steps = k - p0 < kTile ? k - p0 : kTile;
      for (int64_t pp = 0; pp < steps; ++pp) {
        const float w = qs[tx][pp];
        for (int r = 0; r < kRowsPerThread; ++r) {
          acc[r] = fmaf(xs[ty + kThreadRows * r][pp], w, acc[r]);
        }
      }
      __syncthreads();
    }
    if (j < n) {
      const float s = scales[j];
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int64_t i = m0 + ty + kThreadRows * r;
        if (i < m) StoreAs(y, yt, i * n + j, __fmul_rn(acc[r], s));
      }
    }
  }
}

}  // namespace

cudaError_t Int8Gemm(const void* x, ElemType xt, const int8_t* q,
                     const float* scales, void* y, ElemType yt, int64_t m,
                     int64_t n, int64_t k, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  const int64_t n_tiles = (n + kTile - 1) / kTile;
  const int64_t m_tiles = (m + kTile - 1) / kTile;
  if (n_tiles > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned int>(n_tiles),
                  static_cast<unsigned int>(m_tiles < 65535 ? m_tiles : 65535));
  Int8GemmKernel<<<grid, dim3(kTile, kThreadRows), 0, stream>>>(
      x, xt, q, scales, y, yt, m, n, k);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
