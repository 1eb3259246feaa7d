// Launchers for the CUDA kernels of the AccumulateLossTotals and
// PackLossTotals slots (core/ops/loss_totals.h). Conventions as in
// elementwise.h. One thread does the few float64 operations exactly as the
// CPU kernel orders them (IEEE float64 addition and division round the same
// on both), so the totals agree bit for bit.
#ifndef CORE_OPS_CUDA_LOSS_TOTALS_H_
#define CORE_OPS_CUDA_LOSS_TOTALS_H_

#include <cuda_runtime.h>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// totals (fp32 [9]) += the micro-batch's loss_sum (fp32 [4]) as the op
// states; num_microbatches > 0.
cudaError_t AccumulateLossTotals(const float* loss_sum, int num_microbatches,
                                 float* totals, cudaStream_t stream);

// packed (fp32 [6]) = the three values of totals (fp32 [9]) as hi/lo pairs.
cudaError_t PackLossTotals(const float* totals, float* packed,
                           cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_LOSS_TOTALS_H_
