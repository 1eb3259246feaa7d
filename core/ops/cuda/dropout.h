// Launcher for the dropout CUDA kernel of //core/ops/cuda:kernels (the
// Dropout slot, core/ops/dropout.h). Conventions as in elementwise.h.
#ifndef CORE_OPS_CUDA_DROPOUT_H_
#define CORE_OPS_CUDA_DROPOUT_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// y[e] = x[e] * (keep ? scale : 0) for n elements, keep when (W[offset + e]
// >> 8) >= threshold, W the seed's Philox4x32-10 stream exactly as
// core/ops/dropout.h defines it (so the CPU's and the GPU's masks agree
// element for element); identity copies (p == 0). y may be x.
cudaError_t Dropout(const void* x, ElemType xt, void* y, ElemType yt, int64_t n,
                    uint64_t seed, uint64_t offset, uint32_t threshold,
                    float scale, bool identity, cudaStream_t stream);

// Block j of the seed's stream as the kernel computes it, run on the host:
// lets a machine without a GPU check the kernel's generator against the
// CPU's (registrations_nodevice_test).
void PhiloxBlockForTesting(uint64_t j, uint64_t seed, uint32_t out[4]);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_DROPOUT_H_
