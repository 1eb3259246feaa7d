#ifndef INFERENCE_PAGED_KV_CACHE_H_
#define INFERENCE_PAGED_KV_CACHE_H_

// Keys and values of every sequence being generated, in fixed-size blocks
// from one pool (vLLM's paged attention): a sequence holds a table of block
// numbers, so sequences of any length share the pool without fragmentation,
// and a request that does not fit waits until others finish.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace mcc {
namespace inference {

// The geometry of one rank's cache: its layers (this pipeline stage's) and
// kv heads (this tensor-parallel rank's).
struct KvCacheShape {
  int64_t num_layers = 0;
  int64_t kv_heads = 0;  // Local query groups.
  int64_t head_dim = 0;
  int64_t block_size = 16;  // Tokens per block.
  // Bytes of one block over every layer, keys and values (fp32).
  int64_t BlockBytes() const {
    return 2 * num_layers * block_size * kv_heads * head_dim * 4;
  }
};

// The block numbers of one sequence, in position order: position p lives in
// block table[p / block_size] at offset p % block_size. kFreedBlock marks a
// block given back early (behind a sliding window): its positions are never
// read again.
using BlockTable = std::vector<int32_t>;
inline constexpr int32_t kFreedBlock = -1;

// The pool: fp32 [blocks, block_size, kv_heads, head_dim] per layer for keys
// and for values, on the host. Allocation is deterministic (lowest free
// numbers first), so every rank that replays the same calls holds the same
// tables. Not thread-safe: one engine thread owns it.
class PagedKvCache {
 public:
  // As many blocks as `bytes` holds (at least one, else an error naming
  // --kv-cache-bytes).
  static absl::StatusOr<PagedKvCache> Create(const KvCacheShape& shape,
                                             int64_t bytes);
  // Exactly `blocks` blocks.
  static PagedKvCache WithBlocks(const KvCacheShape& shape, int64_t blocks);
  // The blocks `bytes` holds (at least one, else Create's error).
  static absl::StatusOr<int64_t> BlocksIn(const KvCacheShape& shape,
                                          int64_t bytes);
  // The block bookkeeping of `blocks` blocks whose keys and values live
  // elsewhere (a device's pool: inference/device_step.h): Allocate, Free
  // and the counts only; Key and Value must not be called.
  static PagedKvCache BookkeepingOnly(const KvCacheShape& shape,
                                      int64_t blocks);
  bool has_storage() const { return !keys_.empty(); }

  const KvCacheShape& shape() const { return shape_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  // Blocks that `tokens` positions need.
  int64_t BlocksFor(int64_t tokens) const {
    return (tokens + shape_.block_size - 1) / shape_.block_size;
  }

  // Appends `count` blocks to *table; false (and nothing taken) when fewer
  // are free.
  bool Allocate(int64_t count, BlockTable* table);
  // Returns the table's blocks to the pool and clears it.
  void Free(BlockTable* table);
  // Sliding windows: returns the blocks wholly before `first_position` (the
  // oldest position any later query reads) to the pool, marking them
  // kFreedBlock. Returns how many it freed.
  int64_t FreeBefore(int64_t first_position, BlockTable* table);

  // The d floats of (layer, head) at `position` of a sequence whose table
  // is `table` (the table must cover the position).
  float* Key(int64_t layer, const int32_t* table, int64_t position,
             int64_t head) {
    return keys_[layer].data() + Offset(table, position, head);
  }
  float* Value(int64_t layer, const int32_t* table, int64_t position,
               int64_t head) {
    return values_[layer].data() + Offset(table, position, head);
  }

 private:
  int64_t Offset(const int32_t* table, int64_t position, int64_t head) const {
    const int64_t block = table[position / shape_.block_size];
    const int64_t slot =
        block * shape_.block_size + position % shape_.block_size;
    return (slot * shape_.kv_heads + head) * shape_.head_dim;
  }

  KvCacheShape shape_;
  int64_t num_blocks_ = 0;
  std::vector<int32_t> free_;  // Descending: the back is the lowest.
  std::vector<std::vector<float>> keys_, values_;
};

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_PAGED_KV_CACHE_H_
