#ifndef INFERENCE_PAGED_ATTENTION_H_
#define INFERENCE_PAGED_ATTENTION_H_

#include <cstdint>

#include "inference/paged_kv_cache.h"

namespace mcc {
namespace inference {

// Causal attention of token rows over a paged cache: row r (a token of some
// sequence at positions[r], whose block table is tables[r]) attends to that
// sequence's cached positions 0 .. positions[r] (with a sliding window,
// window_left >= 0: only positions[r] - window_left .. positions[r]), which
// must already hold keys and values (the row's own included). q and out are
// fp32 [rows, heads, head_dim]; head h reads kv head h / (heads / kv_heads).
// Each row is computed alone in a fixed order, so its result does not depend
// on the other rows. Uses the global thread pool.
void PagedAttention(const float* q, int64_t rows, int64_t heads,
                    const int64_t* positions, const int32_t* const* tables,
                    int64_t layer, PagedKvCache* cache, float* out,
                    int64_t window_left = -1);

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_PAGED_ATTENTION_H_
