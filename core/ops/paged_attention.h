#ifndef CORE_OPS_PAGED_ATTENTION_H_
#define CORE_OPS_PAGED_ATTENTION_H_

// The inference engine's decoding ops on a device: token rows of many
// sequences, each at its own position, over a paged KV pool (vLLM's paged
// attention) whose block tables live on the device with the pool.
//
// The pool of one layer: k_pool and v_pool fp32 [blocks, block_size,
// groups, head_dim]; position p of a sequence whose block table is t lives
// at slot t[p / block_size] * block_size + p % block_size.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/ops/rotary.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// Writes row r's key and value (k, v fp32 [rows, groups, head_dim]) into
// slot slots[r] (int64 [rows], a slot as above) of the pools. The slots
// must be distinct. Kernels check a slot outside the pool where they can
// (the CPU kernel does, and writes nothing then).
absl::Status PagedKvWrite(const Tensor& k, const Tensor& v, const Tensor& slots,
                          Tensor* k_pool, Tensor* v_pool);

// out [rows, heads, head_dim] fp32 (overwritten) = softmax(q k^T /
// sqrt(head_dim)) v, row r (q fp32 [rows, heads, head_dim]) attending to its
// sequence's positions 0 .. positions[r] (int64 [rows]) through its block
// table block_tables[r] (int32 [rows, max_blocks]; entries past the
// position's block are not read); head h reads group h / (heads / groups).
// With a sliding window (window_left >= 0, Mistral's sliding_window - 1)
// only positions max(0, p - window_left) .. p are read, so table entries
// of blocks wholly before the window (freed by the engine) are not read.
// Each row is computed alone in a fixed order (its result does not depend
// on the other rows). The caller keeps tables within the pool: the CUDA
// kernel does not check them.
absl::Status PagedAttention(const Tensor& q, const Tensor& k_pool,
                            const Tensor& v_pool, const Tensor& block_tables,
                            const Tensor& positions, Tensor* out,
                            int64_t window_left = -1);

// RotaryForward (core/ops/rotary.h) of x [rows, heads, head_dim] (fp32 or
// bf16; y like x, may be x) with row r at position positions[r] (int64
// [rows]; options.position_offset is ignored): the same rotation, each row
// at its own position.
absl::Status RotaryAtPositions(const Tensor& x, const Tensor& positions,
                               const RotaryOptions& options, Tensor* y);

using PagedKvWriteKernel = absl::Status (*)(const Tensor& k, const Tensor& v,
                                            const Tensor& slots, Tensor* k_pool,
                                            Tensor* v_pool);
KernelSlot<PagedKvWriteKernel>& PagedKvWriteKernels();
using PagedAttentionKernel = absl::Status (*)(const Tensor& q,
                                              const Tensor& k_pool,
                                              const Tensor& v_pool,
                                              const Tensor& block_tables,
                                              const Tensor& positions,
                                              Tensor* out, int64_t window_left);
KernelSlot<PagedAttentionKernel>& PagedAttentionKernels();
using RotaryAtPositionsKernel = absl::Status (*)(const Tensor& x,
                                                 const Tensor& positions,
                                                 const RotaryOptions& options,
                                                 Tensor* y);
KernelSlot<RotaryAtPositionsKernel>& RotaryAtPositionsKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_PAGED_ATTENTION_H_
