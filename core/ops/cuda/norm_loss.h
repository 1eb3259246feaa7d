// Launchers for the row-wise CUDA kernels of //core/ops/cuda:kernels:
// LayerNorm, RMSNorm and softmax cross-entropy. Conventions as in
// elementwise.h (untyped device pointers with their element types, fp32
// arithmetic, one rounding per output, the launch error returned, no
// synchronisation). Reductions run in a fixed order: results do not depend
// on timing.
#ifndef CORE_OPS_CUDA_NORM_LOSS_H_
#define CORE_OPS_CUDA_NORM_LOSS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// Over the last dimension of a row-major [rows, cols] x:
//   LayerNorm (mean not null): y = (x - mean) * rstd * gamma + beta,
//     rstd = 1 / sqrt(var + eps), biased variance;
//   RMSNorm (mean and beta null): y = x * rstd * gamma,
//     rstd = 1 / sqrt(mean(x^2) + eps).
// gamma and beta share the type gt. mean and rstd (fp32 [rows]) are
// overwritten and saved for the backward; y is overwritten.
cudaError_t NormForward(const void* x, ElemType xt, const void* gamma,
                        const void* beta, ElemType gt, void* y, ElemType yt,
                        float* mean, float* rstd, int64_t rows, int64_t cols,
                        float eps, cudaStream_t stream);

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma (the
// mean(g) term only for LayerNorm, i.e. mean not null), overwritten; and
// dgamma[c] += sum_r dy * xhat, dbeta[c] += sum_r dy (fp32 [cols]; either
// may be null to skip it).
cudaError_t NormBackward(const void* dy, ElemType dyt, const void* x,
                         ElemType xt, const void* gamma, ElemType gt,
                         const float* mean, const float* rstd, void* dx,
                         ElemType dxt, float* dgamma, float* dbeta,
                         int64_t rows, int64_t cols, cudaStream_t stream);

// Softmax cross-entropy of [rows, vocab] logits against int32 or int64
// targets [rows] (tt is kI32 or kI64):
//   lse[r] = logsumexp(logits[r, :]); loss[r] = lse[r] - logits[r, t[r]],
// 0 where t[r] == ignore_index. A target outside [0, vocab) that is not
// ignore_index cannot be reported without synchronising, so its loss is NaN
// (the loss sum turns NaN and the trainer's NaN check names the step).
cudaError_t CrossEntropyForward(const void* logits, ElemType lt,
                                const void* targets, ElemType tt, float* loss,
                                float* lse, int64_t rows, int64_t vocab,
                                int64_t ignore_index, cudaStream_t stream);
// dlogits[r, j] = dloss[r] * (exp(logits[r, j] - lse[r]) - [j == t[r]]), a
// zero row for ignored targets and a NaN row for out-of-range ones.
// dlogits may be logits itself (same type).
cudaError_t CrossEntropyBackward(const void* logits, ElemType lt,
                                 const void* targets, ElemType tt,
                                 const float* lse, const float* dloss,
                                 void* dlogits, ElemType dt, int64_t rows,
                                 int64_t vocab, int64_t ignore_index,
                                 cudaStream_t stream);

// Cross entropy over a vocabulary split across ranks (core/ops/cross_entropy.h,
// the Sharded* ops): logits [rows, local] of which the first `valid`
// columns are real; targets hold global ids (tt kI32 or kI64).
//   row_max[r] = max over valid columns (-inf when none): exact.
//   sums[r] = float(sum over valid columns of expf(x - row_max[r]), in
//   float64); sums[rows + r] = x[t] - row_max[r] for the target's column t
//   on this shard, else 0.
//   loss[r] = logf(sums[r]) - sums[rows + r], 0 for ignored targets.
//   dlogits = expf(x - row_max) * (1 / sums[r]) * dloss[r] on valid
//   columns, minus dloss[r] at the target, 0 on padding and ignored rows.
cudaError_t ShardedCrossEntropyRowMax(const void* logits, ElemType lt,
                                      int64_t rows, int64_t local,
                                      int64_t valid, float* row_max,
                                      cudaStream_t stream);
cudaError_t ShardedCrossEntropySums(const void* logits, ElemType lt,
                                    const void* targets, ElemType tt,
                                    const float* row_max, int64_t rows,
                                    int64_t local, int64_t vocab_start,
                                    int64_t valid, float* sums,
                                    cudaStream_t stream);
cudaError_t ShardedCrossEntropyLoss(const float* sums, const void* targets,
                                    ElemType tt, int64_t rows,
                                    int64_t ignore_index, float* loss,
                                    cudaStream_t stream);
cudaError_t ShardedCrossEntropyBackward(
    const void* logits, ElemType lt, const void* targets, ElemType tt,
    const float* row_max, const float* sums, const float* dloss, int64_t rows,
    int64_t local, int64_t vocab_start, int64_t valid, int64_t ignore_index,
    void* dlogits, ElemType dt, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_NORM_LOSS_H_
