#include "core/ops/cuda/embedding.h"
#include "core/ops/cuda/kernel_util.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;
using internal::kThreads;
using internal::LoadAs;
using internal::StoreAs;

__device__ __forceinline__ int64_t IdAt(const void* ids, ElemType it,
                                        int64_t t) {
  return it == ElemType::kI32 ? static_cast<const int32_t*>(ids)[t]
                              : static_cast<const int64_t*>(ids)[t];
}

__global__ void LookupKernel(const void* ids, ElemType it, int64_t tokens,
                             const void* table, ElemType tt, int64_t vocab,
                             int64_t hidden, int64_t vocab_start,
                             bool mask_outside, void* out, ElemType ot) {
  const int64_t n = tokens * hidden;
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t t = i / hidden, c = i % hidden;
    const int64_t row = IdAt(ids, it, t) - vocab_start;
    float v;
    if (row >= 0 && row < vocab) {
      v = LoadAs(table, tt, row * hidden + c);
    } else {
      v = mask_outside ? 0.0f : __int_as_float(0x7fc00000);
    }
    StoreAs(out, ot, i, v);
  }
}

__global__ void BackwardKernel(const void* ids, ElemType it, int64_t tokens,
                               const void* dout, ElemType dt, int64_t vocab,
                               int64_t hidden, int64_t vocab_start,
                               float* dtable) {
  for (int64_t c = GlobalThread(); c < hidden; c += GridStride()) {
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t row = IdAt(ids, it, t) - vocab_start;
      if (row < 0 || row >= vocab) continue;
      dtable[row * hidden + c] += LoadAs(dout, dt, t * hidden + c);
    }
  }
}

}  // namespace

cudaError_t EmbeddingLookup(const void* ids, ElemType it, int64_t tokens,
                            const void* table, ElemType tt, int64_t vocab,
                            int64_t hidden, int64_t vocab_start,
                            bool mask_outside, void* out, ElemType ot,
                            cudaStream_t stream) {
  const int64_t n = tokens * hidden;
  if (n == 0) return cudaSuccess;
  LookupKernel<<<GridFor(n), kThreads, 0, stream>>>(ids, it, tokens, table, tt,
                                                    vocab, hidden, vocab_start,
                                                    mask_outside, out, ot);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackward(const void* ids, ElemType it, int64_t tokens,
                              const void* dout, ElemType dt, int64_t vocab,
                              int64_t hidden, int64_t vocab_start,
                              float* dtable, cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return cudaSuccess;
  BackwardKernel<<<GridFor(hidden), kThreads, 0, stream>>>(
      ids, it, tokens, dout, dt, vocab, hidden, vocab_start, dtable);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
