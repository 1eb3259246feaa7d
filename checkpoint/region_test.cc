#include "checkpoint/region.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace {

// Global element value: a unique code of its coordinates.
int64_t Code(const std::vector<int64_t>& idx) {
  int64_t c = 0;
  for (int64_t i : idx) c = c * 1000 + i + 1;
  return c;
}

// A box's block, filled with the codes of its elements.
std::vector<int64_t> Fill(const Box& b) {
  std::vector<int64_t> out(b.NumElements());
  std::vector<int64_t> idx(b.shape.size(), 0);
  for (int64_t n = 0; n < b.NumElements(); ++n) {
    std::vector<int64_t> g(idx.size());
    for (size_t d = 0; d < idx.size(); ++d) g[d] = b.offsets[d] + idx[d];
    out[n] = Code(g);
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[d] < b.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Element-by-element reference: which dst positions src covers.
void ReferenceCopy(const std::vector<int64_t>& src, const Box& sb,
                   std::vector<int64_t>* dst, const Box& db, int64_t* n) {
  std::vector<int64_t> idx(db.shape.size(), 0);
  for (int64_t k = 0; k < db.NumElements(); ++k) {
    bool inside = true;
    int64_t si = 0;
    for (size_t d = 0; d < idx.size(); ++d) {
      const int64_t g = db.offsets[d] + idx[d];
      const int64_t l = g - sb.offsets[d];
      if (l < 0 || l >= sb.shape[d]) inside = false;
      si = si * sb.shape[d] + l;
    }
    if (inside) {
      (*dst)[k] = src[si];
      ++*n;
    }
    for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[d] < db.shape[d]) break;
      idx[d] = 0;
    }
  }
}

TEST(RegionTest, IntersectAndContains) {
  Box a{{0, 4}, {8, 4}};
  Box b{{2, 6}, {8, 8}};
  Box x = Intersect(a, b);
  EXPECT_EQ(x.offsets, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(x.shape, (std::vector<int64_t>{6, 2}));
  EXPECT_TRUE(Intersect(Box{{0}, {4}}, Box{{4}, {4}}).Empty());
  EXPECT_TRUE(Contains(Box{{0, 0}, {10, 10}}, a));
  EXPECT_FALSE(Contains(a, b));
  EXPECT_EQ(a.ToString(), "[0:8, 4:8]");
}

TEST(RegionTest, Dim0SplitIsOneRun) {
  Box src{{4, 0, 0}, {4, 3, 5}};
  Box dst{{0, 0, 0}, {16, 3, 5}};
  int runs = 0;
  ForEachOverlapRun(src, dst, [&](int64_t si, int64_t di, int64_t n) {
    ++runs;
    EXPECT_EQ(si, 0);
    EXPECT_EQ(di, 4 * 15);
    EXPECT_EQ(n, 60);
  });
  EXPECT_EQ(runs, 1);
}

TEST(RegionTest, ScalarBoxes) {
  Box s{{}, {}};
  int64_t a = 42, b = 0;
  EXPECT_EQ(CopyOverlap(&a, s, &b, s, sizeof(int64_t)), 1);
  EXPECT_EQ(b, 42);
}

TEST(RegionTest, RandomBoxesMatchElementwiseReference) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 3000; ++trial) {
    const int nd = 1 + trial % 4;
    std::vector<int64_t> global(nd);
    for (auto& g : global) g = 1 + rng() % 7;
    auto random_box = [&] {
      Box b;
      for (int d = 0; d < nd; ++d) {
        const int64_t lo = rng() % global[d];
        const int64_t hi = lo + 1 + rng() % (global[d] - lo);
        b.offsets.push_back(lo);
        b.shape.push_back(hi - lo);
      }
      return b;
    };
    const Box sb = random_box();
    const Box db = random_box();
    const std::vector<int64_t> src = Fill(sb);
    std::vector<int64_t> got(db.NumElements(), -1), want(db.NumElements(), -1);
    const int64_t n =
        CopyOverlap(src.data(), sb, got.data(), db, sizeof(int64_t));
    int64_t want_n = 0;
    ReferenceCopy(src, sb, &want, db, &want_n);
    ASSERT_EQ(n, want_n) << "src " << sb.ToString() << " dst " << db.ToString();
    ASSERT_EQ(got, want) << "src " << sb.ToString() << " dst " << db.ToString();
    // Every copied value is the code of its own global position.
    const std::vector<int64_t> truth = Fill(db);
    for (size_t k = 0; k < got.size(); ++k) {
      if (got[k] != -1) {
        ASSERT_EQ(got[k], truth[k]);
      }
    }
  }
}

TEST(RegionTest, ShardsTileTheDestination) {
  // A [6, 10, 4] tensor stored as a 3 x 2 grid of shards over dims 0 and 1,
  // read as one region crossing all of them.
  const std::vector<int64_t> global{6, 10, 4};
  Box want{{1, 3, 1}, {4, 6, 2}};
  std::vector<int64_t> out(want.NumElements(), -1);
  int64_t total = 0;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) {
      Box s{{2 * i, 5 * j, 0}, {2, 5, 4}};
      const auto data = Fill(s);
      total += CopyOverlap(data.data(), s, out.data(), want, sizeof(int64_t));
    }
  }
  EXPECT_EQ(total, want.NumElements());
  EXPECT_EQ(out, Fill(want));
}

}  // namespace
}  // namespace mcc
