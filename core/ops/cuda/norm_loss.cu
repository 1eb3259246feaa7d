#include "core/ops/cuda/kernel_util.cuh"
#include "core/ops/cuda/norm_loss.h"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::BlockMax;
using internal::BlockSum;
using internal::Load;
using internal::RowThreads;
using internal::Store;

// One block per row; two passes (mean, then centred variance) for accuracy.
template <typename T>
__global__ void LayerNormForwardKernel(const T* x, const float* gamma,
                                       const float* beta, T* y, float* mean_out,
                                       float* rstd_out, int64_t cols,
                                       float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += Load(xr, c);
  const float mean = BlockSum(sum, scratch) / static_cast<float>(cols);
  float sq = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = Load(xr, c) - mean;
    sq += d * d;
  }
  const float var = BlockSum(sq, scratch) / static_cast<float>(cols);
  // rsqrtf: at most 2 ulp (CUDA Programming Guide, single-precision
  // functions), the same on every device; the tests allow 1e-4 relative.
  const float rstd = rsqrtf(var + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    Store(yr, c, (Load(xr, c) - mean) * rstd * gamma[c] + beta[c]);
  }
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dx = rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g*xhat)), one block a row.
template <typename T>
__global__ void LayerNormBackwardDxKernel(const T* dy, const T* x,
                                          const float* gamma, const float* mean,
                                          const float* rstd, T* dx,
                                          int64_t cols) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* dyr = dy + row * cols;
  const T* xr = x + row * cols;
  T* dxr = dx + row * cols;
  const float mu = mean[row], rs = rstd[row];
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = Load(dyr, c) * gamma[c];
    s1 += g;
    s2 += g * (Load(xr, c) - mu) * rs;
  }
  const float inv = 1.0f / static_cast<float>(cols);
  const float m1 = BlockSum(s1, scratch) * inv;
  const float m2 = BlockSum(s2, scratch) * inv;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = (Load(xr, c) - mu) * rs;
    Store(dxr, c, rs * (Load(dyr, c) * gamma[c] - m1 - xhat * m2));
  }
}

// dgamma[c] = sum_r dy * xhat, dbeta[c] = sum_r dy; 32 x 32 threads per 32
// columns, fixed summation order.
template <typename T>
__global__ void LayerNormBackwardParamsKernel(const T* dy, const T* x,
                                              const float* mean,
                                              const float* rstd, float* dgamma,
                                              float* dbeta, int64_t rows,
                                              int64_t cols) {
  __shared__ float pg[32][33];
  __shared__ float pb[32][33];
  const int64_t col = blockIdx.x * int64_t{32} + threadIdx.x;
  float ag = 0.0f, ab = 0.0f;
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += 32) {
      const float d = Load(dy, r * cols + col);
      ag += d * (Load(x, r * cols + col) - mean[r]) * rstd[r];
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
    dgamma[col] = sg;
    dbeta[col] = sb;
  }
}

template <typename T>
__global__ void CrossEntropyForwardKernel(const T* logits,
                                          const int64_t* labels, float* loss,
                                          float* lse_out, int64_t vocab,
                                          int64_t ignore_index) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    mx = fmaxf(mx, Load(lr, j));
  mx = BlockMax(mx, scratch);
  // __expf(x): at most 2 + floor(1.173 |x|) ulp (CUDA Programming Guide,
  // intrinsic functions), documented and device-independent. Here x <= 0
  // and each term's error is weighted by exp(x), so the sum is off by
  // (2 + 1.173 m) ulp relative, m the softmax-weighted mean of |x| (a few
  // units for real logits): lse to about 1e-6, within the tests' 2e-5.
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    s += __expf(Load(lr, j) - mx);
  const float lse = mx + logf(BlockSum(s, scratch));
  if (threadIdx.x == 0) {
    const int64_t label = labels[row];
    lse_out[row] = lse;
    if (label == ignore_index) {
      loss[row] = 0.0f;
    } else if (label < 0 || label >= vocab) {
      loss[row] = __int_as_float(0x7fc00000);
    } else {
      loss[row] = lse - Load(lr, label);
    }
  }
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(const float* dloss, const T* logits,
                                           const int64_t* labels,
                                           const float* lse, T* dlogits,
                                           int64_t vocab,
                                           int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  const int64_t label = labels[row];
  const T* lr = logits + row * vocab;
  T* dr = dlogits + row * vocab;
  const bool ignored = label == ignore_index;
  const float scale = ignored ? 0.0f : dloss[row];
  const float l = lse[row];
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    // Relative error (2 + 1.173 |x|) ulp, x = z - lse <= 0: at most 2.5e-6
    // wherever p > 1e-7 (|x| < 16); smaller p are off by under 2e-12.
    const float p = ignored ? 0.0f : __expf(Load(lr, j) - l);
    Store(dr, j, scale * (p - (j == label ? 1.0f : 0.0f)));
  }
}

cudaError_t Launched() { return cudaGetLastError(); }

template <typename T>
cudaError_t LayerNormForward(const T* x, const float* gamma, const float* beta,
                             T* y, float* mean, float* rstd, int64_t rows,
                             int64_t cols, float eps, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  LayerNormForwardKernel<<<static_cast<unsigned int>(rows), RowThreads(cols), 0,
                           stream>>>(x, gamma, beta, y, mean, rstd, cols, eps);
  return Launched();
}

template <typename T>
cudaError_t LayerNormBackward(const T* dy, const T* x, const float* gamma,
                              const float* mean, const float* rstd, T* dx,
                              float* dgamma, float* dbeta, int64_t rows,
                              int64_t cols, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  if (rows > 0) {
    LayerNormBackwardDxKernel<<<static_cast<unsigned int>(rows),
                                RowThreads(cols), 0, stream>>>(
        dy, x, gamma, mean, rstd, dx, cols);
    if (cudaError_t e = Launched(); e != cudaSuccess) return e;
  }
  const dim3 block(32, 32);
  const dim3 grid(static_cast<unsigned int>((cols + 31) / 32));
  LayerNormBackwardParamsKernel<<<grid, block, 0, stream>>>(
      dy, x, mean, rstd, dgamma, dbeta, rows, cols);
  return Launched();
}

template <typename T>
cudaError_t CrossEntropyForward(const T* logits, const int64_t* labels,
                                float* loss, float* lse, int64_t rows,
                                int64_t vocab, int64_t ignore_index,
                                cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  CrossEntropyForwardKernel<<<static_cast<unsigned int>(rows),
                              RowThreads(vocab), 0, stream>>>(
      logits, labels, loss, lse, vocab, ignore_index);
  return Launched();
}

template <typename T>
cudaError_t CrossEntropyBackward(const float* dloss, const T* logits,
                                 const int64_t* labels, const float* lse,
                                 T* dlogits, int64_t rows, int64_t vocab,
                                 int64_t ignore_index, cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return cudaSuccess;
  CrossEntropyBackwardKernel<<<static_cast<unsigned int>(rows),
                               RowThreads(vocab), 0, stream>>>(
      dloss, logits, labels, lse, dlogits, vocab, ignore_index);
  return Launched();
}

}  // namespace

cudaError_t LayerNormForwardF32(const float* x, const float* gamma,
                                const float* beta, float* y, float* mean,
                                float* rstd, int64_t rows, int64_t cols,
                                float eps, cudaStream_t stream) {
  return LayerNormForward(x, gamma, beta, y, mean, rstd, rows, cols, eps,
                          stream);
}

cudaError_t LayerNormForwardBF16(const uint16_t* x, const float* gamma,
                                 const float* beta, uint16_t* y, float* mean,
                                 float* rstd, int64_t rows, int64_t cols,
                                 float eps, cudaStream_t stream) {
  return LayerNormForward(x, gamma, beta, y, mean, rstd, rows, cols, eps,
                          stream);
}

cudaError_t LayerNormBackwardF32(const float* dy, const float* x,
                                 const float* gamma, const float* mean,
                                 const float* rstd, float* dx, float* dgamma,
                                 float* dbeta, int64_t rows, int64_t cols,
                                 cudaStream_t stream) {
  return LayerNormBackward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows,
                           cols, stream);
}

cudaError_t LayerNormBackwardBF16(const uint16_t* dy, const uint16_t* x,
                                  const float* gamma, const float* mean,
                                  const float* rstd, uint16_t* dx,
                                  float* dgamma, float* dbeta, int64_t rows,
                                  int64_t cols, cudaStream_t stream) {
  return LayerNormBackward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows,
                           cols, stream);
}

cudaError_t CrossEntropyForwardF32(const float* logits, const int64_t* labels,
                                   float* loss, float* lse, int64_t rows,
                                   int64_t vocab, int64_t ignore_index,
                                   cudaStream_t stream) {
  return CrossEntropyForward(logits, labels, loss, lse, rows, vocab,
                             ignore_index, stream);
}

cudaError_t CrossEntropyForwardBF16(const uint16_t* logits,
                                    const int64_t* labels, float* loss,
                                    float* lse, int64_t rows, int64_t vocab,
                                    int64_t ignore_index, cudaStream_t stream) {
  return CrossEntropyForward(logits, labels, loss, lse, rows, vocab,
                             ignore_index, stream);
}

cudaError_t CrossEntropyBackwardF32(const float* dloss, const float* logits,
                                    const int64_t* labels, const float* lse,
                                    float* dlogits, int64_t rows, int64_t vocab,
                                    int64_t ignore_index, cudaStream_t stream) {
  return CrossEntropyBackward(dloss, logits, labels, lse, dlogits, rows, vocab,
                              ignore_index, stream);
}

cudaError_t CrossEntropyBackwardBF16(const float* dloss, const uint16_t* logits,
                                     const int64_t* labels, const float* lse,
                                     uint16_t* dlogits, int64_t rows,
                                     int64_t vocab, int64_t ignore_index,
                                     cudaStream_t stream) {
  return CrossEntropyBackward(dloss, logits, labels, lse, dlogits, rows, vocab,
                              ignore_index, stream);
}

}  // namespace cuda_kernels
}  // namespace mcc
