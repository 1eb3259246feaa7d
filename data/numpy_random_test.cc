#include "data/numpy_random.h"

#include <numeric>
#include <sstream>
#include <vector>

#include "data/test_util.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

// Fixture: data/testdata/numpy_shuffle.txt, written by
// data/testdata/gen_numpy_fixtures.py with numpy 1.24 (Debian python3-numpy):
// each line "seed n <first shuffle of arange(n)> | <second shuffle>".
TEST(NumpyRandomState, ShuffleMatchesNumpy) {
  std::istringstream in(
      testing::ReadAll(testing::Runfile("data/testdata/numpy_shuffle.txt")));
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    uint64_t seed;
    int64_t n;
    ls >> seed >> n;
    std::vector<int64_t> want1(n), want2(n);
    for (auto& v : want1) ls >> v;
    std::string bar;
    ls >> bar;
    for (auto& v : want2) ls >> v;
    ASSERT_EQ(bar, "|");
    NumpyRandomState rng(static_cast<uint32_t>(seed));
    std::vector<int64_t> a(n), b(n);
    std::iota(a.begin(), a.end(), 0);
    std::iota(b.begin(), b.end(), 0);
    rng.Shuffle(a.data(), n);
    rng.Shuffle(b.data(), n);
    EXPECT_EQ(a, want1) << "seed " << seed << " n " << n;
    EXPECT_EQ(b, want2) << "seed " << seed << " n " << n;
    ++cases;
  }
  EXPECT_EQ(cases, 4);
}

TEST(NumpyRandomState, RawOutputIsMT19937) {
  // numpy.random.RandomState(5489).randint(0, 2**32, 5, dtype=uint64) gives
  // 3499211612 581869302 3890346734 3586334585 545404204 (the reference
  // MT19937 stream for seed 5489).
  NumpyRandomState rng(5489);
  const uint32_t want[] = {3499211612u, 581869302u, 3890346734u, 3586334585u,
                           545404204u};
  for (uint32_t w : want) EXPECT_EQ(rng.NextUInt32(), w);
}

TEST(NumpyRandomState, RandomIntervalStaysInRange) {
  NumpyRandomState rng(3);
  for (uint64_t max : {1ull, 2ull, 5ull, 1000ull, (1ull << 33) + 7}) {
    uint64_t seen_max = 0;
    for (int i = 0; i < 2000; ++i) {
      const uint64_t v = rng.RandomInterval(max);
      ASSERT_LE(v, max);
      seen_max = std::max(seen_max, v);
    }
    if (max <= 5) {
      EXPECT_EQ(seen_max, max);
    }
  }
}

}  // namespace
}  // namespace mcc::data
