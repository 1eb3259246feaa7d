#include "core/ops/cuda/kernel_util.cuh"
#include "core/ops/cuda/reduce.h"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;
using internal::kThreads;
using internal::LoadAs;

constexpr int64_t kBlock = 1024;     // core/ops/kernel_util.h's kBlock
constexpr int64_t kPartBlocks = 64;  // reduce.cc's kPartial / kBlock
constexpr int kLanes = 8;

int64_t Blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }
int64_t Parts(int64_t n) { return (Blocks(n) + kPartBlocks - 1) / kPartBlocks; }

// Eight threads per 1024-element block, one per lane, 32 blocks per CUDA
// block (looping when the grid is capped); v * v is exact in float64, so a
// contracted fma equals the CPU's multiply-add.
__global__ void BlockSumsKernel(const void* x, ElemType xt, int64_t n,
                                bool square, double* block_sums,
                                int64_t blocks) {
  constexpr int64_t kPerCudaBlock = kThreads / kLanes;
  __shared__ double lanes[kThreads];
  const int lane = threadIdx.x % kLanes;
  for (int64_t group = blockIdx.x; group * kPerCudaBlock < blocks;
       group += gridDim.x) {
    const int64_t b = group * kPerCudaBlock + threadIdx.x / kLanes;
    double acc = 0.0;
    if (b < blocks) {
      const int64_t start = b * kBlock;
      const int64_t m = n - start < kBlock ? n - start : kBlock;
      int64_t i = 0;
      for (; i + kLanes <= m; i += kLanes) {
        const double v = LoadAs(x, xt, start + i + lane);
        acc += square ? v * v : v;
      }
      if (lane == 0) {
        for (; i < m; ++i) {
          const double v = LoadAs(x, xt, start + i);
          acc += square ? v * v : v;
        }
      }
    }
    lanes[threadIdx.x] = acc;
    __syncthreads();
    if (lane == 0 && b < blocks) {
      const double* a = &lanes[threadIdx.x];
      block_sums[b] =
          ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    }
    __syncthreads();  // lanes is rewritten by the next group
  }
}

__global__ void PartialSumsKernel(const double* block_sums, int64_t blocks,
                                  double* partials, int64_t parts) {
  for (int64_t q = GlobalThread(); q < parts; q += GridStride()) {
    const int64_t end =
        (q + 1) * kPartBlocks < blocks ? (q + 1) * kPartBlocks : blocks;
    double s = 0.0;
    for (int64_t b = q * kPartBlocks; b < end; ++b) s += block_sums[b];
    partials[q] = s;
  }
}

__global__ void TotalKernel(const double* partials, int64_t parts,
                            double* result) {
  double total = 0.0;
  for (int64_t q = 0; q < parts; ++q) total += partials[q];
  *result = total;
}

__global__ void CountZerosKernel(const void* x, bool wide, int64_t n,
                                 unsigned long long* count) {
  unsigned long long z = 0;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    if (wide) {
      z += (static_cast<const uint32_t*>(x)[i] << 1) == 0;
    } else {
      z += static_cast<uint16_t>(static_cast<const uint16_t*>(x)[i] << 1) == 0;
    }
  }
  if (z != 0) atomicAdd(count, z);
}

__device__ __forceinline__ void SplitDouble(double v, float* p) {
  p[0] = static_cast<float>(v);
  p[1] = static_cast<float>(v - static_cast<double>(p[0]));
}

__global__ void FinishKernel(const double* sums,
                             const unsigned long long* zeros, int counted,
                             int checked, double scale, float* out) {
  double sq = 0.0, zero_count = 0.0;
  bool bad = false;
  for (int t = 0; t < counted; ++t) {
    if (!isfinite(sums[t])) {
      bad = true;
    } else {
      sq += sums[t];
    }
    if (zeros != nullptr) zero_count += static_cast<double>(zeros[t]);
  }
  for (int t = counted; t < counted + checked; ++t) {
    if (!isfinite(sums[t])) bad = true;
  }
  sq *= scale * scale;
  if (bad) {
    out[0] = __int_as_float(0x7f800000);
    out[1] = 0.0f;
  } else {
    SplitDouble(sq, out);
  }
  SplitDouble(zero_count, out + 2);
}

}  // namespace

int64_t OrderedSumScratch(int64_t n) { return Blocks(n) + Parts(n); }

cudaError_t OrderedSum(const void* x, ElemType xt, int64_t n, bool square,
                       double* scratch, double* result, cudaStream_t stream) {
  const int64_t blocks = Blocks(n), parts = Parts(n);
  double* block_sums = scratch;
  double* partials = scratch + blocks;
  if (blocks > 0) {
    BlockSumsKernel<<<GridFor(blocks * kLanes), kThreads, 0, stream>>>(
        x, xt, n, square, block_sums, blocks);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    PartialSumsKernel<<<GridFor(parts), kThreads, 0, stream>>>(
        block_sums, blocks, partials, parts);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  TotalKernel<<<1, 1, 0, stream>>>(partials, parts, result);
  return cudaGetLastError();
}

cudaError_t CountZeros(const void* x, ElemType xt, int64_t n,
                       unsigned long long* count, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CountZerosKernel<<<GridFor(n), kThreads, 0, stream>>>(x, xt == ElemType::kF32,
                                                        n, count);
  return cudaGetLastError();
}

cudaError_t FinishSumOfSquares(const double* sums,
                               const unsigned long long* zeros, int counted,
                               int checked, double scale, float* out,
                               cudaStream_t stream) {
  FinishKernel<<<1, 1, 0, stream>>>(sums, zeros, counted, checked, scale, out);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
