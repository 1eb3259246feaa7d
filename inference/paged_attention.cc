#include "inference/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "inference/row_gemm.h"

namespace mcc {
namespace inference {

void PagedAttention(const float* q, int64_t rows, int64_t heads,
                    const int64_t* positions, const int32_t* const* tables,
                    int64_t layer, PagedKvCache* cache, float* out) {
  const int64_t d = cache->shape().head_dim;
  const int64_t per_group = heads / cache->shape().kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ThreadPool::Global().ParallelFor(
      rows * heads, 1, [&](int64_t t0, int64_t t1) {
        std::vector<float> scores;
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t r = t / heads, h = t % heads, g = h / per_group;
          const int64_t keys = positions[r] + 1;
          const float* qrow = q + (r * heads + h) * d;
          scores.resize(keys);
          float max_score = -INFINITY;
          for (int64_t j = 0; j < keys; ++j) {
            scores[j] =
                FixedOrderDot(qrow, cache->Key(layer, tables[r], j, g), d) *
                scale;
            max_score = std::max(max_score, scores[j]);
          }
          float* orow = out + (r * heads + h) * d;
          std::fill(orow, orow + d, 0.0f);
          float sum = 0;
          for (int64_t j = 0; j < keys; ++j) {
            const float p = std::exp(scores[j] - max_score);
            sum += p;
            const float* vrow = cache->Value(layer, tables[r], j, g);
            for (int64_t e = 0; e < d; ++e) orow[e] += p * vrow[e];
          }
          const float inv = 1.0f / sum;
          for (int64_t e = 0; e < d; ++e) orow[e] *= inv;
        }
      });
}

}  // namespace inference
}  // namespace mcc
