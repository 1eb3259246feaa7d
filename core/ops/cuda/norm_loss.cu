#include "core/ops/cuda/kernel_util.cuh"
#include "core/ops/cuda/norm_loss.h"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::BlockMax;
using internal::BlockSum;
using internal::LoadAs;
using internal::RowThreads;
using internal::StoreAs;

// One block per row; two passes (mean, then centred sum of squares) for
// accuracy. 1 / sqrtf is IEEE-rounded (nvcc's default -prec-div and
// -prec-sqrt), as the CPU kernel's 1 / std::sqrt.
__global__ void NormForwardKernel(const void* x, ElemType xt, const void* gamma,
                                  const void* beta, ElemType gt, void* y,
                                  ElemType yt, float* mean_out, float* rstd_out,
                                  int64_t cols, float eps) {
  __shared__ float scratch[32];
  const bool layer = mean_out != nullptr;
  const int64_t base = blockIdx.x * cols;
  float mean = 0.0f;
  if (layer) {
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      sum += LoadAs(x, xt, base + c);
    mean = BlockSum(sum, scratch) / static_cast<float>(cols);
  }
  float sq = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = LoadAs(x, xt, base + c) - mean;
    sq += d * d;
  }
  const float var = BlockSum(sq, scratch) / static_cast<float>(cols);
  const float rstd = 1.0f / sqrtf(var + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float out = (LoadAs(x, xt, base + c) - mean) * rstd * LoadAs(gamma, gt, c);
    if (layer) out += LoadAs(beta, gt, c);
    StoreAs(y, yt, base + c, out);
  }
  if (threadIdx.x == 0) {
    if (layer) mean_out[blockIdx.x] = mean;
    rstd_out[blockIdx.x] = rstd;
  }
}

// dx for one row per block. dx may be dy or x: each thread reads an
// element before it writes it, after the row's sums are complete.
__global__ void NormBackwardDxKernel(const void* dy, ElemType dyt,
                                     const void* x, ElemType xt,
                                     const void* gamma, ElemType gt,
                                     const float* mean, const float* rstd,
                                     void* dx, ElemType dxt, int64_t cols) {
  __shared__ float scratch[32];
  const bool layer = mean != nullptr;
  const int64_t row = blockIdx.x;
  const int64_t base = row * cols;
  const float mu = layer ? mean[row] : 0.0f, rs = rstd[row];
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = LoadAs(dy, dyt, base + c) * LoadAs(gamma, gt, c);
    s1 += g;
    s2 += g * ((LoadAs(x, xt, base + c) - mu) * rs);
  }
  const float inv = 1.0f / static_cast<float>(cols);
  const float m1 = layer ? BlockSum(s1, scratch) * inv : 0.0f;
  const float m2 = BlockSum(s2, scratch) * inv;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = (LoadAs(x, xt, base + c) - mu) * rs;
    const float g = LoadAs(dy, dyt, base + c) * LoadAs(gamma, gt, c);
    StoreAs(dx, dxt, base + c, (g - m1 - xhat * m2) * rs);
  }
}

// dgamma[c] += sum_r dy * xhat, dbeta[c] += sum_r dy; 32 x 32 threads per 32
// columns, a fixed summation order.
__global__ void NormBackwardParamsKernel(const void* dy, ElemType dyt,
                                         const void* x, ElemType xt,
                                         const float* mean, const float* rstd,
                                         float* dgamma, float* dbeta,
                                         int64_t rows, int64_t cols) {
  __shared__ float pg[32][33];
  __shared__ float pb[32][33];
  const int64_t col = blockIdx.x * int64_t{32} + threadIdx.x;
  float ag = 0.0f, ab = 0.0f;
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += 32) {
      const int64_t i = r * cols + col;
      const float d = LoadAs(dy, dyt, i);
      const float mu = mean != nullptr ? mean[r] : 0.0f;
      ag += d * ((LoadAs(x, xt, i) - mu) * rstd[r]);
      ab += d;
    }
  }
  pg[threadIdx.y][threadIdx.x] = ag;
  pb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sg = 0.0f, sb = 0.0f;
    for (int k = 0; k < 32; ++k) {
      sg += pg[k][threadIdx.x];
      sb += pb[k][threadIdx.x];
    }
    if (dgamma != nullptr) dgamma[col] += sg;
    if (dbeta != nullptr) dbeta[col] += sb;
  }
}

__device__ __forceinline__ int64_t TargetAt(const void* t, ElemType tt,
                                            int64_t r) {
  return tt == ElemType::kI32 ? static_cast<const int32_t*>(t)[r]
                              : static_cast<const int64_t*>(t)[r];
}

// expf: at most 2 ulp (CUDA Programming Guide), as the CPU's Exp8.
__global__ void CrossEntropyForwardKernel(const void* logits, ElemType lt,
                                          const void* targets, ElemType tt,
                                          float* loss, float* lse_out,
                                          int64_t vocab, int64_t ignore_index) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * vocab;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    mx = fmaxf(mx, LoadAs(logits, lt, base + j));
  mx = BlockMax(mx, scratch);
  float s = 0.0f;
  if (!isinf(mx)) {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
      s += expf(LoadAs(logits, lt, base + j) - mx);
  }
  s = BlockSum(s, scratch);
  // All -inf (or an inf): nothing to sum, as the CPU kernel.
  const float lse = isinf(mx) ? mx : mx + logf(s);
  if (threadIdx.x == 0) {
    const int64_t t = TargetAt(targets, tt, row);
    lse_out[row] = lse;
    if (t == ignore_index) {
      loss[row] = 0.0f;
    } else if (t < 0 || t >= vocab) {
      loss[row] = __int_as_float(0x7fc00000);
    } else {
      loss[row] = lse - LoadAs(logits, lt, base + t);
    }
  }
}

__global__ void CrossEntropyBackwardKernel(const void* logits, ElemType lt,
                                           const void* targets, ElemType tt,
                                           const float* lse, const float* dloss,
                                           void* dlogits, ElemType dt,
                                           int64_t vocab,
                                           int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  const int64_t base = row * vocab;
  const int64_t t = TargetAt(targets, tt, row);
  if (t == ignore_index) {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
      StoreAs(dlogits, dt, base + j, 0.0f);
    return;
  }
  const bool bad = t < 0 || t >= vocab;
  const float g = bad ? __int_as_float(0x7fc00000) : dloss[row];
  const float l = lse[row];
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float p = expf(LoadAs(logits, lt, base + j) - l);
    StoreAs(dlogits, dt, base + j, (j == t ? p - 1.0f : p) * g);
  }
}

__device__ __forceinline__ double WarpSumDouble(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A float64 sum over a block whose size is a multiple of 32 (thread 0 gets
// the result).
__device__ __forceinline__ double BlockSumDouble(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = WarpSumDouble(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0;
  return WarpSumDouble(v);
}

__global__ void ShardedRowMaxKernel(const void* logits, ElemType lt,
                                    int64_t local, int64_t valid,
                                    float* row_max) {
  __shared__ float scratch[32];
  const int64_t base = blockIdx.x * local;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
    mx = fmaxf(mx, LoadAs(logits, lt, base + j));
  mx = BlockMax(mx, scratch);
  if (threadIdx.x == 0) row_max[blockIdx.x] = mx;
}

__global__ void ShardedSumsKernel(const void* logits, ElemType lt,
                                  const void* targets, ElemType tt,
                                  const float* row_max, int64_t rows,
                                  int64_t local, int64_t vocab_start,
                                  int64_t valid, float* sums) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * local;
  const float mx = row_max[row];
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
    s += expf(LoadAs(logits, lt, base + j) - mx);
  s = BlockSumDouble(s, scratch);
  if (threadIdx.x == 0) {
    const int64_t c = TargetAt(targets, tt, row) - vocab_start;
    sums[rows + row] =
        c >= 0 && c < valid ? LoadAs(logits, lt, base + c) - mx : 0.0f;
    sums[row] = static_cast<float>(s);
  }
}

__global__ void ShardedLossKernel(const float* sums, const void* targets,
                                  ElemType tt, int64_t rows,
                                  int64_t ignore_index, float* loss) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    loss[r] = TargetAt(targets, tt, r) == ignore_index
                  ? 0.0f
                  : logf(sums[r]) - sums[rows + r];
  }
}

__global__ void ShardedBackwardKernel(const void* logits, ElemType lt,
                                      const void* targets, ElemType tt,
                                      const float* row_max, const float* sums,
                                      const float* dloss, int64_t local,
                                      int64_t vocab_start, int64_t valid,
                                      int64_t ignore_index, void* dlogits,
                                      ElemType dt) {
  const int64_t row = blockIdx.x;
  const int64_t base = row * local;
  const int64_t target = TargetAt(targets, tt, row);
  const bool ignored = target == ignore_index;
  const int64_t t = target - vocab_start;
  const float mx = row_max[row];
  const float inv = 1.0f / sums[row];
  const float g = dloss[row];
  for (int64_t j = threadIdx.x; j < local; j += blockDim.x) {
    float v = 0.0f;
    if (!ignored && j < valid) {
      const float p = expf(LoadAs(logits, lt, base + j) - mx) * inv;
      v = j == t ? p * g - g : p * g;
    }
    StoreAs(dlogits, dt, base + j, v);
  }
}

cudaError_t Launched() { return cudaGetLastError(); }

}  // namespace

cudaError_t NormForward(const void* x, ElemType xt, const void* gamma,
                        const void* beta, ElemType gt, void* y, ElemType yt,
                        float* mean, float* rstd, int64_t rows, int64_t cols,
                        float eps, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  NormForwardKernel<<<static_cast<unsigned int>(rows), RowThreads(cols), 0,
                      stream>>>(x, xt, gamma, beta, gt, y, yt, mean, rstd, cols,
                                eps);
  return Launched();
}

cudaError_t NormBackward(const void* dy, ElemType dyt, const void* x,
                         ElemType xt, const void* gamma, ElemType gt,
                         const float* mean, const float* rstd, void* dx,
                         ElemType dxt, float* dgamma, float* dbeta,
                         int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  // Parameter gradients first: dx may be dy itself, which the dx kernel
  // overwrites.
  if (dgamma != nullptr || dbeta != nullptr) {
    const dim3 block(32, 32);
    const dim3 grid(static_cast<unsigned int>((cols + 31) / 32));
    NormBackwardParamsKernel<<<grid, block, 0, stream>>>(
        dy, dyt, x, xt, mean, rstd, dgamma, dbeta, rows, cols);
    if (cudaError_t e = Launched(); e != cudaSuccess) return e;
  }
  NormBackwardDxKernel<<<static_cast<unsigned int>(rows), RowThreads(cols), 0,
                         stream>>>(dy, dyt, x, xt, gamma, gt, mean, rstd, dx,
                                   dxt, cols);
  return Launched();
}

cudaError_t CrossEntropyForward(const void* logits, ElemType lt,
                                const void* targets, ElemType tt, float* loss,
                                float* lse, int64_t rows, int64_t vocab,
                                int64_t ignore_index, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  CrossEntropyForwardKernel<<<static_cast<unsigned int>(rows),
                              RowThreads(vocab), 0, stream>>>(
      logits, lt, targets, tt, loss, lse, vocab, ignore_index);
  return Launched();
}

cudaError_t CrossEntropyBackward(const void* logits, ElemType lt,
                                 const void* targets, ElemType tt,
                                 const float* lse, const float* dloss,
                                 void* dlogits, ElemType dt, int64_t rows,
                                 int64_t vocab, int64_t ignore_index,
                                 cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return cudaSuccess;
  CrossEntropyBackwardKernel<<<static_cast<unsigned int>(rows),
                               RowThreads(vocab), 0, stream>>>(
      logits, lt, targets, tt, lse, dloss, dlogits, dt, vocab, ignore_index);
  return Launched();
}

cudaError_t ShardedCrossEntropyRowMax(const void* logits, ElemType lt,
                                      int64_t rows, int64_t local,
                                      int64_t valid, float* row_max,
                                      cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  ShardedRowMaxKernel<<<static_cast<unsigned int>(rows), RowThreads(valid), 0,
                        stream>>>(logits, lt, local, valid, row_max);
  return Launched();
}

cudaError_t ShardedCrossEntropySums(const void* logits, ElemType lt,
                                    const void* targets, ElemType tt,
                                    const float* row_max, int64_t rows,
                                    int64_t local, int64_t vocab_start,
                                    int64_t valid, float* sums,
                                    cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  ShardedSumsKernel<<<static_cast<unsigned int>(rows), RowThreads(valid), 0,
                      stream>>>(logits, lt, targets, tt, row_max, rows, local,
                                vocab_start, valid, sums);
  return Launched();
}

cudaError_t ShardedCrossEntropyLoss(const float* sums, const void* targets,
                                    ElemType tt, int64_t rows,
                                    int64_t ignore_index, float* loss,
                                    cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  ShardedLossKernel<<<internal::GridFor(rows), internal::kThreads, 0, stream>>>(
      sums, targets, tt, rows, ignore_index, loss);
  return Launched();
}

cudaError_t ShardedCrossEntropyBackward(
    const void* logits, ElemType lt, const void* targets, ElemType tt,
    const float* row_max, const float* sums, const float* dloss, int64_t rows,
    int64_t local, int64_t vocab_start, int64_t valid, int64_t ignore_index,
    void* dlogits, ElemType dt, cudaStream_t stream) {
  if (rows == 0 || local == 0) return cudaSuccess;
  ShardedBackwardKernel<<<static_cast<unsigned int>(rows), RowThreads(local), 0,
                          stream>>>(logits, lt, targets, tt, row_max, sums,
                                    dloss, local, vocab_start, valid,
                                    ignore_index, dlogits, dt);
  return Launched();
}

}  // namespace cuda_kernels
}  // namespace mcc
