#ifndef MODELS_GPT_KV_CACHE_H_
#define MODELS_GPT_KV_CACHE_H_

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mcc {
namespace gpt {

// One layer's cached keys and values (after rotary), fp32
// [batch, capacity, local kv heads, head_dim]: this rank's heads under
// tensor parallelism. Positions [0, KvCache::length) are filled.
struct LayerKvCache {
  Tensor k, v;
};

// Keys and values of the tokens seen so far, for incremental decoding
// (GPTModel::Prefill, then DecodeStep). Made by GPTModel::NewKvCache and
// owned by the caller; one cache per batch of sequences being generated.
struct KvCache {
  int64_t batch = 0;
  int64_t capacity = 0;  // Positions the tensors hold.
  int64_t length = 0;    // Positions filled so far.
  std::vector<LayerKvCache> layers;
};

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_KV_CACHE_H_
