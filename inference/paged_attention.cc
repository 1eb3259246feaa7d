#include "inference/paged_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/kernel_util.h"
#include "core/ops/sliding_window.h"
#include "core/thread_pool.h"

namespace mcc {
namespace inference {
namespace {

constexpr int kKeys = 8;  // keys scored together

// Lane j of the result is the sum of v[j]'s eight lanes in one fixed tree,
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), whatever the other
// vectors hold: a key's score does not depend on the keys beside it.
inline __m256 TransposedSums(const __m256 v[kKeys]) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]);
  const __m256 t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]);
  const __m256 t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);
  const __m256 u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                       _mm256_permute2f128_ps(u0, u1, 0x31));
}

// scores[j] = scale * q . key(j) for n <= kKeys keys: 8-lane FMAs over
// [0, d - d % 8), the fixed lane tree above, then the d % 8 tail in order.
template <typename KeyAt>
void ScoreKeys(const float* q, int64_t d, int n, KeyAt key_at, float scale,
               float* scores) {
  // Missing keys repeat the first (their lanes are dropped), so the loop
  // below always runs all kKeys and keeps its accumulators in registers.
  const float* keys[kKeys];
  for (int j = 0; j < kKeys; ++j) keys[j] = key_at(j < n ? j : 0);
  __m256 acc[kKeys];
  for (int j = 0; j < kKeys; ++j) acc[j] = _mm256_setzero_ps();
  const int64_t d8 = d / 8 * 8;
  for (int64_t i = 0; i < d8; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int j = 0; j < kKeys; ++j) {
      acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys[j] + i), acc[j]);
    }
  }
  alignas(32) float sums[kKeys];
  _mm256_store_ps(sums, TransposedSums(acc));
  for (int j = 0; j < n; ++j) {
    float s = sums[j];
    for (int64_t i = d8; i < d; ++i) s = std::fma(q[i], keys[j][i], s);
    scores[j] = s * scale;
  }
}

// p[j] = exp(p[j] - max) in place: 8 lanes at a time, the tail through
// VecExp, which is Exp8's lane bit for bit (so a key's weight does not
// depend on where it falls in the blocks).
void ExpShifted(float* p, int64_t n, float max) {
  const __m256 m = _mm256_set1_ps(max);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(p + j,
                     ops::Exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), m)));
  }
  for (; j < n; ++j) p[j] = ops::VecExp(p[j] - max);
}

// out[0, d) = sum_j p[j] * value(j) over j in increasing order, each lane
// one fma chain held in a register (64 lanes at a time, then 8, then one):
// no store and reload of out per key.
template <typename ValueAt>
void WeightedValues(const float* p, int64_t keys, int64_t d, ValueAt value_at,
                    float* out) {
  int64_t e0 = 0;
  for (; e0 + 64 <= d; e0 += 64) {
    __m256 acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
    for (int64_t j = 0; j < keys; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      const float* v = value_at(j) + e0;
      for (int u = 0; u < 8; ++u) {
        acc[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * u), acc[u]);
      }
    }
    for (int u = 0; u < 8; ++u) _mm256_storeu_ps(out + e0 + 8 * u, acc[u]);
  }
  for (; e0 + 8 <= d; e0 += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < keys; ++j) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]),
                            _mm256_loadu_ps(value_at(j) + e0), acc);
    }
    _mm256_storeu_ps(out + e0, acc);
  }
  for (; e0 < d; ++e0) {
    float acc = 0;
    for (int64_t j = 0; j < keys; ++j)
      acc = std::fma(p[j], value_at(j)[e0], acc);
    out[e0] = acc;
  }
}

}  // namespace

void PagedAttention(const float* q, int64_t rows, int64_t heads,
                    const int64_t* positions, const int32_t* const* tables,
                    int64_t layer, PagedKvCache* cache, float* out,
                    int64_t window_left) {
  const int64_t d = cache->shape().head_dim;
  const int64_t per_group = heads / cache->shape().kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // Whole rows per chunk: a row's heads read neighbouring bytes of each
  // position's keys and values.
  ThreadPool::Global().ParallelFor(
      rows * heads, heads, [&](int64_t t0, int64_t t1) {
        std::vector<float> scores;
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t r = t / heads, h = t % heads, g = h / per_group;
          // The window's first position; blocks before it may be freed.
          const int64_t first =
              ops::SlidingWindowFirstKey(positions[r], window_left);
          const int64_t keys = positions[r] + 1 - first;
          const float* qrow = q + (r * heads + h) * d;
          scores.resize(keys);
          for (int64_t j0 = 0; j0 < keys; j0 += kKeys) {
            const int n = static_cast<int>(std::min<int64_t>(kKeys, keys - j0));
            ScoreKeys(
                qrow, d, n,
                [&](int j) {
                  return cache->Key(layer, tables[r], first + j0 + j, g);
                },
                scale, scores.data() + j0);
          }
          const float max_score =
              *std::max_element(scores.begin(), scores.end());
          ExpShifted(scores.data(), keys, max_score);
          float* orow = out + (r * heads + h) * d;
          WeightedValues(
              scores.data(), keys, d,
              [&](int64_t j) {
                return cache->Value(layer, tables[r], first + j, g);
              },
              orow);
          float sum = 0;
          for (int64_t j = 0; j < keys; ++j) sum += scores[j];
          const float inv = 1.0f / sum;
          for (int64_t e = 0; e < d; ++e) orow[e] *= inv;
        }
      });
}

}  // namespace inference
}  // namespace mcc
