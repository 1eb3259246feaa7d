#include "inference/paged_kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace inference {

absl::StatusOr<int64_t> PagedKvCache::BlocksIn(const KvCacheShape& shape,
                                               int64_t bytes) {
  if (shape.num_layers <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache: layers ", shape.num_layers, ", kv heads ", shape.kv_heads,
        ", head dim ", shape.head_dim, " and block size ", shape.block_size,
        " must be positive"));
  }
  const int64_t blocks = bytes / shape.BlockBytes();
  if (blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-bytes ", bytes, " holds no block of ",
                     shape.block_size, " tokens (", shape.BlockBytes(),
                     " bytes over ", shape.num_layers, " layers)"));
  }
  return blocks;
}

absl::StatusOr<PagedKvCache> PagedKvCache::Create(const KvCacheShape& shape,
                                                  int64_t bytes) {
  absl::StatusOr<int64_t> blocks = BlocksIn(shape, bytes);
  if (!blocks.ok()) return blocks.status();
  return WithBlocks(shape, *blocks);
}

PagedKvCache PagedKvCache::BookkeepingOnly(const KvCacheShape& shape,
                                           int64_t blocks) {
  PagedKvCache cache;
  cache.shape_ = shape;
  cache.num_blocks_ = blocks;
  for (int64_t b = blocks - 1; b >= 0; --b) {
    cache.free_.push_back(static_cast<int32_t>(b));
  }
  return cache;
}

PagedKvCache PagedKvCache::WithBlocks(const KvCacheShape& shape,
                                      int64_t blocks) {
  PagedKvCache cache;
  cache.shape_ = shape;
  cache.num_blocks_ = blocks;
  for (int64_t b = blocks - 1; b >= 0; --b) {
    cache.free_.push_back(static_cast<int32_t>(b));
  }
  const int64_t floats =
      blocks * shape.block_size * shape.kv_heads * shape.head_dim;
  cache.keys_.assign(shape.num_layers, std::vector<float>(floats, 0.0f));
  cache.values_.assign(shape.num_layers, std::vector<float>(floats, 0.0f));
  return cache;
}

bool PagedKvCache::Allocate(int64_t count, BlockTable* table) {
  if (count > free_blocks()) return false;
  for (int64_t i = 0; i < count; ++i) {
    table->push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void PagedKvCache::Free(BlockTable* table) {
  // Keep free_ descending so the lowest numbers go first (deterministic).
  for (int32_t b : *table) {
    if (b != kFreedBlock) free_.push_back(b);
  }
  std::sort(free_.begin(), free_.end(),
            [](int32_t a, int32_t b) { return a > b; });
  table->clear();
}

int64_t PagedKvCache::FreeBefore(int64_t first_position, BlockTable* table) {
  const int64_t whole = std::min<int64_t>(
      std::max<int64_t>(first_position, 0) / shape_.block_size,
      static_cast<int64_t>(table->size()));
  int64_t freed = 0;
  for (int64_t i = 0; i < whole; ++i) {
    if ((*table)[i] == kFreedBlock) continue;
    free_.push_back((*table)[i]);
    (*table)[i] = kFreedBlock;
    ++freed;
  }
  if (freed > 0) {
    std::sort(free_.begin(), free_.end(),
              [](int32_t a, int32_t b) { return a > b; });
  }
  return freed;
}

}  // namespace inference
}  // namespace mcc
