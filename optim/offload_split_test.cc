#include "optim/offload_split.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace optim {
namespace {

TEST(SplitForOffloadTest, WholePiecesInOrderUntilTheShareIsReached) {
  const std::vector<int64_t> sizes = {40, 10, 30, 20};  // 100 elements.
  EXPECT_EQ(*SplitForOffload(sizes, 0.0),
            (std::vector<bool>{false, false, false, false}));
  // 40 >= 0.3 * 100 after the first piece.
  EXPECT_EQ(*SplitForOffload(sizes, 0.3),
            (std::vector<bool>{true, false, false, false}));
  // 40 + 10 = 50 reaches exactly half.
  EXPECT_EQ(*SplitForOffload(sizes, 0.5),
            (std::vector<bool>{true, true, false, false}));
  // 50 < 51: one more whole piece (80 on the host).
  EXPECT_EQ(*SplitForOffload(sizes, 0.51),
            (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(*SplitForOffload(sizes, 1.0),
            (std::vector<bool>{true, true, true, true}));
}

TEST(SplitForOffloadTest, EmptyAndZeroSizedPieces) {
  EXPECT_TRUE(SplitForOffload({}, 0.5)->empty());
  // Nothing to move: no piece is marked.
  EXPECT_EQ(*SplitForOffload({0, 0}, 0.5), (std::vector<bool>{false, false}));
}

TEST(SplitForOffloadTest, RefusesAFractionOutsideZeroToOne) {
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    auto split = SplitForOffload({10}, bad);
    ASSERT_FALSE(split.ok()) << bad;
    EXPECT_NE(split.status().message().find("--optimizer-offload-fraction"),
              std::string::npos)
        << split.status();
  }
  EXPECT_FALSE(SplitForOffload({-1}, 0.5).ok());
}

}  // namespace
}  // namespace optim
}  // namespace mcc
