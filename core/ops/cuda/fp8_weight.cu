#include "core/ops/cuda/fp8_weight.h"
#include "core/ops/cuda/kernel_util.cuh"

namespace mcc {
namespace cuda_kernels {
namespace fp8w {

__device__ __forceinline__ float* SharedFloats() {
  extern __shared__ float4 fp8w_shared[];
  return reinterpret_cast<float*>(fp8w_shared);
}

}  // namespace fp8w
}  // namespace cuda_kernels
}  // namespace mcc

// After CUDA's headers and SharedFloats: the bodies use both.
#include "core/ops/cuda/fp8_weight_kernels.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::RowThreads;

__global__ void CheckRowsKernel(fp8w::QuantizeParams p) {
  fp8w::CheckRowsBody(p);
}

__global__ void QuantizeRowsKernel(fp8w::QuantizeParams p) {
  fp8w::QuantizeRowsBody(p);
}

__global__ void __launch_bounds__(fp8w::kSkinnyThreads)
    SkinnyGemmKernel(fp8w::GemmParams p) {
  fp8w::SkinnyGemmBody(p);
}

__global__ void __launch_bounds__(fp8w::kTileThreads)
    TiledGemmKernel(fp8w::GemmParams p) {
  fp8w::TiledGemmBody(p);
}

// The weight rows both row passes (check, quantise) read.
fp8w::QuantizeParams RowsOf(const void* w, ElemType wt, const float* absmax,
                            int64_t rows, int64_t cols) {
  fp8w::QuantizeParams p;
  p.w = w;
  p.wt = wt;
  p.absmax = absmax;
  p.rows = rows;
  p.cols = cols;
  return p;
}

unsigned int RowBlocks(int64_t rows) {
  return static_cast<unsigned int>(rows < 65536 ? (rows > 0 ? rows : 1)
                                                : 65536);
}

}  // namespace

cudaError_t CheckFp8WeightRows(const void* w, ElemType wt, const float* absmax,
                               int64_t rows, int64_t cols,
                               unsigned long long* bad, cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(bad, 0xff, sizeof(*bad), stream);
  if (e != cudaSuccess || rows == 0 || cols == 0) return e;
  fp8w::QuantizeParams p = RowsOf(w, wt, absmax, rows, cols);
  p.bad = bad;
  CheckRowsKernel<<<RowBlocks(rows), RowThreads(cols), 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t QuantizeWeightFp8(const void* w, ElemType wt, const float* absmax,
                              int64_t rows, int64_t cols, int8_t* codes,
                              float* scales, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  fp8w::QuantizeParams p = RowsOf(w, wt, absmax, rows, cols);
  p.codes = codes;
  p.scales = scales;
  QuantizeRowsKernel<<<RowBlocks(rows), RowThreads(cols), 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t Fp8WeightGemm(const void* x, ElemType xt, const int8_t* codes,
                          const float* scales, void* y, ElemType yt, int64_t m,
                          int64_t n, int64_t k, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  fp8w::GemmParams p;
  p.x = x;
  p.xt = xt;
  p.codes = codes;
  p.scales = scales;
  p.y = y;
  p.yt = yt;
  p.m = m;
  p.n = n;
  p.k = k;
  if (m <= fp8w::kSkinnyRows) {
    const int64_t warps = fp8w::kSkinnyThreads / 32;
    const int64_t blocks = (n + warps - 1) / warps;
    SkinnyGemmKernel<<<static_cast<unsigned int>(blocks < 65535 ? blocks
                                                                : 65535),
                       fp8w::kSkinnyThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  const int64_t n_tiles = (n + fp8w::kTile - 1) / fp8w::kTile;
  const int64_t m_tiles = (m + fp8w::kTile - 1) / fp8w::kTile;
  if (n_tiles > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned int>(n_tiles),
                  static_cast<unsigned int>(m_tiles < 65535 ? m_tiles : 65535));
  TiledGemmKernel<<<grid, fp8w::kTileThreads, fp8w::kTileSharedBytes, stream>>>(
      p);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
