// Launchers of the flash-attention CUDA kernels of //core/ops/cuda:kernels
// (the FlashAttentionForward and FlashAttentionBackward slots,
// core/ops/attention.h). Conventions as in elementwise.h: device pointers
// with their element types, work enqueued on `stream`, the launch's
// cudaError_t returned, no synchronisation. The callers (registrations.cc)
// have validated shapes and dtypes.
//
// q [b, s, heads, d]; k, v [b, s, kv_heads, d] (one element type, qt); out,
// dout [b, s, heads, d] (ot); lse [b, heads, s] fp32; dq like q (dqt); dk,
// dv like k (dkt). head_dim up to kMaxHeadDim; the kernels are compiled for
// padded head dims 64, 128 and 256 (a head dim pads to the next of them).
// Arithmetic is fp32 whatever the element types (but for the tensor-core
// kernels, below); nothing [s, s] is stored;
// no atomics, so results are the same run to run.
#ifndef CORE_OPS_CUDA_FLASH_ATTENTION_H_
#define CORE_OPS_CUDA_FLASH_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/ops/cuda/elem_type.h"
#include "core/ops/cuda/flash_attention_args.h"

namespace mcc {
namespace cuda_kernels {

// Dynamic shared memory (bytes) the largest kernel for this head_dim needs
// per block: the caller checks it against the device's opt-in limit
// (cudaDevAttrMaxSharedMemoryPerBlockOptin) for a clear error.
size_t FlashAttentionSharedBytes(int64_t head_dim);

// The kernels FlashAttentionForward and FlashAttentionBackward may run: the
// fp32 SIMT kernels, or, for bf16 or fp16 q, k and v with head_dim 64 or
// 128 (16-byte aligned) on an sm_80+ device, the tensor-core kernels
// (fp32 accumulation; the forward, flash_attention_mma_kernels.cuh, rounds
// P to q's type for P V; the backward, flash_attention_mma_backward_
// kernels.cuh, rounds P and dS, and dO when its type is not q's).
enum class FlashKernel { kSimt, kTensorCore };

// Which forward kernel FlashAttentionForward runs for these arguments on
// the current device.
FlashKernel FlashAttentionForwardKernelFor(const FlashAttentionArgs& args,
                                           const void* q, const void* k,
                                           const void* v, ElemType qt);

// Which backward kernels FlashAttentionBackward runs: the forward's
// conditions, and dout 16-byte aligned.
FlashKernel FlashAttentionBackwardKernelFor(const FlashAttentionArgs& args,
                                            const void* q, const void* k,
                                            const void* v, const void* dout,
                                            ElemType qt);

// out = softmax(scale q k^T [causal mask]) v (dropped as args say), lse =
// the rows' logsumexp of the scaled scores; both overwritten. The backward
// takes out and lse from either forward kernel.
cudaError_t FlashAttentionForward(const FlashAttentionArgs& args, const void* q,
                                  const void* k, const void* v, ElemType qt,
                                  void* out, ElemType ot, float* lse,
                                  cudaStream_t stream);

// dq, dk, dv overwritten from q, k, v, out, dout and the forward's lse;
// row_dot is device scratch of batch * heads * seq floats (D = rowsum(dout
// * out)).
cudaError_t FlashAttentionBackward(const FlashAttentionArgs& args,
                                   const void* q, const void* k, const void* v,
                                   ElemType qt, const void* out,
                                   const void* dout, ElemType ot,
                                   const float* lse, void* dq, ElemType dqt,
                                   void* dk, void* dv, ElemType dkt,
                                   float* row_dot, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FLASH_ATTENTION_H_
