// The flash-attention launchers' arguments (flash_attention.h) and how the
// kernels' parameters are filled from them, in plain C++ so that the tests
// running the kernels on the host emulator fill them as the launchers do.
// Standard headers only.
#ifndef CORE_OPS_CUDA_FLASH_ATTENTION_ARGS_H_
#define CORE_OPS_CUDA_FLASH_ATTENTION_ARGS_H_

#include <cstdint>

namespace mcc {
namespace cuda_kernels {

struct FlashAttentionArgs {
  static constexpr int64_t kMaxHeadDim = 256;
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;  // Applied to q (rounded to fp32) before q k^T.
  bool causal = true;
  // Attention dropout exactly as core/ops/attention.h draws it: probability
  // (b, h, i, j) is kept when word
  //   offset + ((b * total_heads + head_offset + h) * seq + i) * seq + j
  // of seed's Philox stream (core/ops/dropout.h), shifted right by 8, is
  // >= threshold; kept probabilities are multiplied by keep_scale.
  bool dropout = false;
  uint32_t threshold = 0;
  float keep_scale = 1.0f;
  uint64_t seed = 0, offset = 0;
  int64_t head_offset = 0, total_heads = 0;
  // Packed documents / sliding windows: int32 [batch, seq] in device
  // memory, the first key each query sees (AttentionOptions::first_key).
  // Null: none.
  const int32_t* first_key = nullptr;
  // False: the forward and the backward always run the SIMT kernels
  // (benchmarks compare the two kinds with it; tests pin one).
  bool tensor_cores = true;
};

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FLASH_ATTENTION_ARGS_H_
