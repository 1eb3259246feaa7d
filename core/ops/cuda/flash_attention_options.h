// ops::AttentionOptions as the flash-attention kernels' arguments: the
// scale, dropout threshold and keep scale computed exactly as the CPU
// kernel (core/ops/attention.cc) computes them. Shared by the CUDA slots
// (registrations.cc) and the tests that run the kernels on the host
// emulator, so both hand the kernels the same numbers.
#ifndef CORE_OPS_CUDA_FLASH_ATTENTION_OPTIONS_H_
#define CORE_OPS_CUDA_FLASH_ATTENTION_OPTIONS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/ops/attention.h"
#include "core/ops/cuda/flash_attention_args.h"

namespace mcc {
namespace ops {
namespace cuda {

// The arguments for q [batch, seq, heads, head_dim] and k, v [batch, seq,
// kv_heads, head_dim] under `o`. first_key is left null: it must point to
// device memory (the emulator's callers pass host memory), the caller's to
// set.
inline cuda_kernels::FlashAttentionArgs FlashAttentionArgsOf(
    int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
    int64_t head_dim, const AttentionOptions& o) {
  cuda_kernels::FlashAttentionArgs a;
  a.batch = batch;
  a.seq = seq;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.scale =
      o.softmax_scale > 0.0f
          ? o.softmax_scale
          : 1.0f /
                std::sqrt(static_cast<float>(std::max<int64_t>(head_dim, 1)));
  a.causal = o.causal;
  a.dropout = o.dropout_p > 0.0f;
  a.threshold = static_cast<uint32_t>(
      std::lround(static_cast<double>(o.dropout_p) * (1 << 24)));
  a.keep_scale = 1.0f / (1.0f - o.dropout_p);
  a.seed = o.dropout_seed;
  a.offset = o.dropout_offset;
  a.head_offset = o.head_offset;
  a.total_heads = o.total_heads > 0 ? o.total_heads : heads;
  return a;
}

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FLASH_ATTENTION_OPTIONS_H_
