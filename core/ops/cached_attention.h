#ifndef CORE_OPS_CACHED_ATTENTION_H_
#define CORE_OPS_CACHED_ATTENTION_H_

// Causal attention of new queries over a KV cache, for incremental decoding
// (the flash kernel needs queries and keys of one length).

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// out = softmax(q k^T / sqrt(d)) v for queries q [b, n, heads, d] (fp32,
// bf16 or fp16) at positions [position, position + n): query i attends to
// the cached positions 0 .. position + i. k_cache and v_cache are fp32
// [b, capacity, groups, d] with those positions filled (position + n <=
// capacity); head h reads group h / (heads / groups). out has q's shape and
// dtype and is overwritten (rounded once from fp32). Runs the slot's kernel
// (core/ops/dispatch.h: the device's current stream, no host
// synchronisation).
absl::Status CachedAttention(const Tensor& q, const Tensor& k_cache,
                             const Tensor& v_cache, int64_t position,
                             Tensor* out);

using CachedAttentionKernel = absl::Status (*)(const Tensor& q,
                                               const Tensor& k_cache,
                                               const Tensor& v_cache,
                                               int64_t position, Tensor* out);
KernelSlot<CachedAttentionKernel>& CachedAttentionKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CACHED_ATTENTION_H_
