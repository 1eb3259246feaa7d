// Launchers of the inference engine's decoding CUDA kernels of
// //core/ops/cuda:kernels (the PagedKvWrite, PagedAttention and
// RotaryAtPositions slots, core/ops/paged_attention.h). Conventions as in
// elementwise.h.
#ifndef CORE_OPS_CUDA_PAGED_ATTENTION_H_
#define CORE_OPS_CUDA_PAGED_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"
#include "core/ops/cuda/rotary.h"

namespace mcc {
namespace cuda_kernels {

// The largest head_dim the paged-attention kernel takes.
constexpr int64_t kPagedAttentionMaxHeadDim = 256;

// Row r of k and v (fp32 [rows, row_elems]) to row slots[r] of the pools
// (fp32 [slots, row_elems]).
cudaError_t PagedKvWrite(const float* k, const float* v, const int64_t* slots,
                         float* k_pool, float* v_pool, int64_t rows,
                         int64_t row_elems, cudaStream_t stream);

// out [rows, heads, d] = softmax(scale q k^T) v of q [rows, heads, d] over
// the pools [blocks, block_size, groups, d], row r seeing its positions
// 0 .. positions[r] (from max(0, positions[r] - window_left) when
// window_left >= 0) through tables [rows, max_blocks] (int32, on the
// device). fp32; deterministic, each row alone.
cudaError_t PagedAttention(const float* q, const float* k_pool,
                           const float* v_pool, const int32_t* tables,
                           const int64_t* positions, float* out, int64_t rows,
                           int64_t heads, int64_t groups, int64_t head_dim,
                           int64_t block_size, int64_t max_blocks, float scale,
                           int64_t window_left, cudaStream_t stream);

// y = x [args.batch rows, args.heads, args.head_dim] rotated as Rotary
// (rotary.h) does, row r at positions[r] (on the device) instead of
// args.position_offset + t; args.seq and args.sign are ignored. y may be x.
cudaError_t RotaryAtPositions(const RotaryArgs& args, const int64_t* positions,
                              const void* x, ElemType xt, void* y, ElemType yt,
                              cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_PAGED_ATTENTION_H_
