// Launchers for the row-wise CUDA kernels of //core/ops/cuda:kernels:
// LayerNorm and softmax cross-entropy. Conventions as in elementwise.h
// (bf16 as uint16_t bits, fp32 arithmetic, returns the launch error).
#ifndef CORE_OPS_CUDA_NORM_LOSS_H_
#define CORE_OPS_CUDA_NORM_LOSS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace mcc {
namespace cuda_kernels {

// LayerNorm over the last dimension of a row-major [rows, cols] x:
//   y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(var + eps)
// (biased variance). gamma and beta are fp32 [cols]; mean and rstd (fp32
// [rows]) are saved for the backward.
cudaError_t LayerNormForwardF32(const float* x, const float* gamma,
                                const float* beta, float* y, float* mean,
                                float* rstd, int64_t rows, int64_t cols,
                                float eps, cudaStream_t stream);
cudaError_t LayerNormForwardBF16(const uint16_t* x, const float* gamma,
                                 const float* beta, uint16_t* y, float* mean,
                                 float* rstd, int64_t rows, int64_t cols,
                                 float eps, cudaStream_t stream);
// dx (like x), dgamma and dbeta (fp32 [cols], overwritten, deterministic).
cudaError_t LayerNormBackwardF32(const float* dy, const float* x,
                                 const float* gamma, const float* mean,
                                 const float* rstd, float* dx, float* dgamma,
                                 float* dbeta, int64_t rows, int64_t cols,
                                 cudaStream_t stream);
cudaError_t LayerNormBackwardBF16(const uint16_t* dy, const uint16_t* x,
                                  const float* gamma, const float* mean,
                                  const float* rstd, uint16_t* dx,
                                  float* dgamma, float* dbeta, int64_t rows,
                                  int64_t cols, cudaStream_t stream);

// Softmax cross-entropy of [rows, vocab] logits against int64 labels [rows]:
//   loss[r] = logsumexp(logits[r, :]) - logits[r, label[r]]
// and lse[r] = logsumexp(logits[r, :]) saved for the backward. Rows whose
// label equals ignore_index get loss 0; a label outside [0, vocab) that is
// not ignore_index gets a NaN loss (so it cannot pass unnoticed).
cudaError_t CrossEntropyForwardF32(const float* logits, const int64_t* labels,
                                   float* loss, float* lse, int64_t rows,
                                   int64_t vocab, int64_t ignore_index,
                                   cudaStream_t stream);
cudaError_t CrossEntropyForwardBF16(const uint16_t* logits,
                                    const int64_t* labels, float* loss,
                                    float* lse, int64_t rows, int64_t vocab,
                                    int64_t ignore_index, cudaStream_t stream);
// dlogits[r, j] = dloss[r] * (softmax(logits[r])[j] - [j == label[r]]), and 0
// for ignored rows. dloss is fp32 [rows] (e.g. 1/count for a mean loss).
cudaError_t CrossEntropyBackwardF32(const float* dloss, const float* logits,
                                    const int64_t* labels, const float* lse,
                                    float* dlogits, int64_t rows, int64_t vocab,
                                    int64_t ignore_index, cudaStream_t stream);
cudaError_t CrossEntropyBackwardBF16(const float* dloss, const uint16_t* logits,
                                     const int64_t* labels, const float* lse,
                                     uint16_t* dlogits, int64_t rows,
                                     int64_t vocab, int64_t ignore_index,
                                     cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_NORM_LOSS_H_
