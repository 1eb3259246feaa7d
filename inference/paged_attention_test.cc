// PagedAttention against a double-precision softmax attention, and each row
// bit-identical alone or beside other rows, for head sizes that take every
// vector path (64-lane blocks, 8-lane blocks, a scalar tail).
#include "inference/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "inference/paged_kv_cache.h"

namespace mcc {
namespace inference {
namespace {

struct Fixture {
  KvCacheShape shape;
  PagedKvCache cache;
  std::vector<BlockTable> tables;
  std::vector<const int32_t*> table_ptrs;
  std::vector<int64_t> positions;
  std::vector<float> q;
  int64_t heads;
};

// `rows` sequences, row r at position positions[r], random keys, values and
// queries; heads query heads over kv_heads cached heads.
Fixture Make(int64_t d, int64_t heads, int64_t kv_heads,
             const std::vector<int64_t>& positions) {
  KvCacheShape shape;
  shape.num_layers = 1;
  shape.kv_heads = kv_heads;
  shape.head_dim = d;
  shape.block_size = 4;
  Fixture f{shape, PagedKvCache::WithBlocks(shape, 256), {}, {}, positions, {},
            heads};
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  const int64_t rows = static_cast<int64_t>(positions.size());
  f.tables.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(f.cache.Allocate(positions[r] / 4 + 1, &f.tables[r]));
    for (int64_t p = 0; p <= positions[r]; ++p) {
      for (int64_t g = 0; g < kv_heads; ++g) {
        float* k = f.cache.Key(0, f.tables[r].data(), p, g);
        float* v = f.cache.Value(0, f.tables[r].data(), p, g);
        for (int64_t e = 0; e < d; ++e) k[e] = dist(rng), v[e] = dist(rng);
      }
    }
  }
  for (const BlockTable& t : f.tables) f.table_ptrs.push_back(t.data());
  f.q.resize(rows * heads * d);
  for (float& x : f.q) x = dist(rng);
  return f;
}

// Sliding windows (window >= 0): row r sees positions[r] - window ..
// positions[r] only.
void CheckAgainstDoubleReference(int64_t window) {
  for (int64_t d : {5, 16, 64, 72, 136}) {
    Fixture f = Make(d, 4, 2, {0, 3, 9, 21});
    const int64_t rows = 4;
    std::vector<float> out(rows * f.heads * d);
    PagedAttention(f.q.data(), rows, f.heads, f.positions.data(),
                   f.table_ptrs.data(), 0, &f.cache, out.data(), window);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < f.heads; ++h) {
        const int64_t first =
            window >= 0 ? std::max<int64_t>(0, f.positions[r] - window) : 0;
        const int64_t g = h / 2, keys = f.positions[r] + 1 - first;
        const float* q = f.q.data() + (r * f.heads + h) * d;
        std::vector<double> s(keys);
        double max = -INFINITY;
        for (int64_t j = 0; j < keys; ++j) {
          const float* k = f.cache.Key(0, f.table_ptrs[r], first + j, g);
          double dot = 0;
          for (int64_t e = 0; e < d; ++e)
            dot += static_cast<double>(q[e]) * k[e];
          s[j] = dot / std::sqrt(static_cast<double>(d));
          max = std::max(max, s[j]);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - max));
        for (int64_t e = 0; e < d; ++e) {
          double ref = 0;
          for (int64_t j = 0; j < keys; ++j) {
            ref +=
                s[j] / sum * f.cache.Value(0, f.table_ptrs[r], first + j, g)[e];
          }
          // fp32 dot products and sums of at most ~136 terms of unit-size
          // values, and exp to a few ulp: well under 1e-4 absolute.
          EXPECT_NEAR(out[(r * f.heads + h) * d + e], ref, 1e-4)
              << "d " << d << " row " << r << " head " << h << " lane " << e
              << " window " << window;
        }
      }
    }
  }
}

TEST(PagedAttentionTest, MatchesDoubleReference) {
  CheckAgainstDoubleReference(-1);
}

TEST(PagedAttentionTest, SlidingWindowMatchesDoubleReference) {
  for (int64_t window : {0, 1, 5, 8}) CheckAgainstDoubleReference(window);
}

TEST(PagedAttentionTest, BlocksBehindTheWindowAreFreedAndNeverRead) {
  const int64_t d = 16, window = 5;
  Fixture f = Make(d, 4, 2, {21});
  std::vector<float> before(f.heads * d), after(f.heads * d);
  PagedAttention(f.q.data(), 1, f.heads, f.positions.data(),
                 f.table_ptrs.data(), 0, &f.cache, before.data(), window);
  // Position 21 reads 16..21: blocks 0-3 (positions 0-15) go back.
  const int64_t free_before = f.cache.free_blocks();
  EXPECT_EQ(f.cache.FreeBefore(21 - window, &f.tables[0]), 4);
  EXPECT_EQ(f.cache.free_blocks(), free_before + 4);
  EXPECT_EQ(f.tables[0][3], kFreedBlock);
  EXPECT_NE(f.tables[0][4], kFreedBlock);
  EXPECT_EQ(f.cache.FreeBefore(21 - window, &f.tables[0]), 0);  // Once.
  // Another sequence takes the freed blocks and fills them with NaN: the
  // windowed row must not see them.
  BlockTable other;
  ASSERT_TRUE(f.cache.Allocate(f.cache.free_blocks(), &other));
  for (int64_t p = 0; p < static_cast<int64_t>(other.size()) * 4; ++p) {
    for (int64_t g = 0; g < 2; ++g) {
      float* k = f.cache.Key(0, other.data(), p, g);
      float* v = f.cache.Value(0, other.data(), p, g);
      for (int64_t e = 0; e < d; ++e) k[e] = v[e] = NAN;
    }
  }
  f.table_ptrs[0] = f.tables[0].data();
  PagedAttention(f.q.data(), 1, f.heads, f.positions.data(),
                 f.table_ptrs.data(), 0, &f.cache, after.data(), window);
  EXPECT_EQ(before, after);
  // Free skips the marked entries: every block is back once.
  f.cache.Free(&f.tables[0]);
  f.cache.Free(&other);
  EXPECT_EQ(f.cache.free_blocks(), f.cache.num_blocks());
}

TEST(PagedAttentionTest, EachRowIsBitIdenticalAloneOrBatched) {
  for (int64_t d : {5, 64, 72}) {
    Fixture f = Make(d, 4, 4, {2, 17, 8, 30, 0});
    const int64_t rows = 5, width = f.heads * d;
    std::vector<float> all(rows * width);
    PagedAttention(f.q.data(), rows, f.heads, f.positions.data(),
                   f.table_ptrs.data(), 0, &f.cache, all.data());
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> alone(width);
      PagedAttention(f.q.data() + r * width, 1, f.heads, &f.positions[r],
                     &f.table_ptrs[r], 0, &f.cache, alone.data());
      EXPECT_EQ(std::memcmp(alone.data(), all.data() + r * width,
                            width * sizeof(float)),
                0)
          << "d " << d << " row " << r;
    }
  }
}

}  // namespace
}  // namespace inference
}  // namespace mcc
