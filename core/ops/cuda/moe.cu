#include "core/ops/cuda/kernel_util.cuh"
#include "core/ops/cuda/moe.h"

namespace mcc {
namespace cuda_kernels {
namespace moe {

__device__ __forceinline__ float* SharedFloats() {
  extern __shared__ float4 moe_shared[];
  return reinterpret_cast<float*>(moe_shared);
}

}  // namespace moe
}  // namespace cuda_kernels
}  // namespace mcc

#include "core/ops/cuda/moe_kernels.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GridFor;
using internal::kThreads;
using moe::kBlockThreads;

// Blocks of kBlockThreads threads, one warp per item.
unsigned int WarpBlocksFor(int64_t items) {
  const int64_t warps = kBlockThreads / 32;
  int64_t blocks = (items + warps - 1) / warps;
  if (blocks > 65536) blocks = 65536;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks);
}

moe::RouterParams RouterParamsOf(const MoeRouterArgs& a) {
  moe::RouterParams p;
  p.tokens = a.tokens;
  p.experts = a.experts;
  p.topk = a.topk;
  p.sigmoid = a.sigmoid;
  p.normalize = a.normalize;
  p.scaling = a.scaling;
  return p;
}

moe::BalanceParams BalanceParamsOf(const MoeBalanceArgs& a) {
  moe::BalanceParams p;
  p.tokens = a.tokens;
  p.experts = a.experts;
  p.topk = a.topk;
  p.sequences = a.sequences;
  p.length = a.length;
  p.sigmoid = a.sigmoid;
  p.coeff = a.coeff;
  p.grad_scale = a.grad_scale;
  return p;
}

}  // namespace

cudaError_t MoeRouterForward(const MoeRouterArgs& a, const float* logits,
                             const float* bias, float* scores, int32_t* indices,
                             float* weights, cudaStream_t stream) {
  if (a.tokens == 0) return cudaSuccess;
  moe::RouterParams p = RouterParamsOf(a);
  p.logits = logits;
  p.bias = bias;
  p.scores = scores;
  p.indices = indices;
  p.weights = weights;
  moe::RouterForwardKernel<<<GridFor(a.tokens), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t MoeRouterBackward(const MoeRouterArgs& a, const float* scores,
                              const int32_t* indices, const float* dweights,
                              float* dlogits, cudaStream_t stream) {
  if (a.tokens == 0) return cudaSuccess;
  moe::RouterParams p = RouterParamsOf(a);
  p.scores = const_cast<float*>(scores);  // Read only.
  p.indices = const_cast<int32_t*>(indices);
  p.dweights = dweights;
  p.dlogits = dlogits;
  moe::RouterBackwardKernel<<<GridFor(a.tokens), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t MoeLoadBalancingLoss(const MoeBalanceArgs& a, const float* scores,
                                 const int32_t* indices, int64_t* counts,
                                 double* psum, float* z, float* loss,
                                 cudaStream_t stream) {
  moe::BalanceParams p = BalanceParamsOf(a);
  p.scores = scores;
  p.indices = indices;
  p.counts = counts;
  p.psum = psum;
  p.z = z;
  p.loss = loss;
  if (a.sigmoid) {
    moe::BalanceNormaliserKernel<<<GridFor(a.tokens), kThreads, 0, stream>>>(p);
  }
  moe::BalanceCountsKernel<<<GridFor(a.sequences * a.experts), kThreads, 0,
                             stream>>>(p);
  if (a.total_counts != nullptr)
    p.counts = const_cast<int64_t*>(a.total_counts);
  moe::BalanceLossKernel<<<1, 32, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t MoeLoadBalancingLossBackward(const MoeBalanceArgs& a,
                                         const float* scores,
                                         const int32_t* indices,
                                         int64_t* counts, float* dlogits,
                                         cudaStream_t stream) {
  moe::BalanceParams p = BalanceParamsOf(a);
  p.scores = scores;
  p.indices = indices;
  p.counts = counts;
  p.dlogits = dlogits;
  if (a.total_counts != nullptr) {
    p.counts = const_cast<int64_t*>(a.total_counts);
  } else {
    moe::BalanceCountsKernel<<<GridFor(a.sequences * a.experts), kThreads, 0,
                               stream>>>(p);
  }
  moe::BalanceBackwardKernel<<<GridFor(a.tokens), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t MoeZLoss(const float* logits, int64_t tokens, int64_t experts,
                     float coeff, double* terms, float* loss,
                     cudaStream_t stream) {
  if (tokens > 0) {
    moe::ZLossTermsKernel<<<GridFor(tokens), kThreads, 0, stream>>>(
        logits, tokens, experts, terms);
  }
  moe::MeanOfTermsKernel<<<1, kBlockThreads, kBlockThreads * sizeof(double),
                           stream>>>(terms, tokens, coeff, loss);
  return cudaGetLastError();
}

cudaError_t MoeZLossBackward(const float* logits, int64_t tokens,
                             int64_t experts, float coeff, float grad_scale,
                             float* dlogits, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  moe::ZLossBackwardKernel<<<GridFor(tokens), kThreads, 0, stream>>>(
      logits, tokens, experts, coeff, grad_scale, dlogits);
  return cudaGetLastError();
}

cudaError_t MoeUpdateExpertBias(const int64_t* counts, int64_t experts,
                                float rate, float* bias, cudaStream_t stream) {
  moe::UpdateExpertBiasKernel<<<1, 32, 0, stream>>>(counts, experts, rate,
                                                    bias);
  return cudaGetLastError();
}

cudaError_t MoeSortTokens(const int32_t* indices, int64_t slots,
                          int64_t experts, int32_t* row_to_slot,
                          int32_t* slot_to_row, int64_t* counts,
                          cudaStream_t stream) {
  moe::SortParams p;
  p.indices = indices;
  p.row_to_slot = row_to_slot;
  p.slot_to_row = slot_to_row;
  p.counts = counts;
  p.slots = slots;
  p.experts = experts;
  const unsigned int blocks = static_cast<unsigned int>(experts);
  const size_t shared = kBlockThreads * sizeof(int32_t);
  moe::SortCountKernel<<<blocks, kBlockThreads, shared, stream>>>(p);
  if (slots == 0) return cudaGetLastError();
  moe::SortScatterKernel<<<blocks, kBlockThreads, shared, stream>>>(p);
  moe::SortMarkInvalidKernel<<<GridFor(slots), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t MoePermute(const void* x, ElemType t, const int32_t* row_to_slot,
                       int64_t tokens, int64_t k, int64_t h, void* permuted,
                       cudaStream_t stream) {
  const int64_t rows = tokens * k;
  if (rows * h == 0) return cudaSuccess;
  const int elem_bytes = t == ElemType::kF32 ? 4 : 2;
  moe::PermuteKernel<<<GridFor(rows * h), kThreads, 0, stream>>>(
      x, t, elem_bytes, row_to_slot, rows, k, h, permuted);
  return cudaGetLastError();
}

cudaError_t MoeUnpermute(const void* expert_out, ElemType t,
                         const int32_t* slot_to_row, const float* weights,
                         int64_t tokens, int64_t k, int64_t h, void* y,
                         cudaStream_t stream) {
  if (tokens * h == 0) return cudaSuccess;
  moe::UnpermuteKernel<<<GridFor(tokens * h), kThreads, 0, stream>>>(
      expert_out, t, slot_to_row, weights, tokens, k, h, y);
  return cudaGetLastError();
}

cudaError_t MoeUnpermuteBackward(const void* dy, const void* expert_out,
                                 ElemType t, const int32_t* slot_to_row,
                                 const float* weights, int64_t tokens,
                                 int64_t k, int64_t h, void* dexpert_out,
                                 float* dweights, cudaStream_t stream) {
  const int64_t rows = tokens * k;
  if (rows == 0) return cudaSuccess;
  if (h > 0) {
    moe::
        UnpermuteBackwardRowsKernel<<<GridFor(rows * h), kThreads, 0, stream>>>(
            dy, t, slot_to_row, weights, rows, k, h, dexpert_out);
  }
  if (dweights != nullptr) {
    moe::UnpermuteBackwardWeightsKernel<<<WarpBlocksFor(rows), kBlockThreads,
                                          kBlockThreads * sizeof(double),
                                          stream>>>(
        dy, expert_out, t, slot_to_row, rows, k, h, dweights);
  }
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
