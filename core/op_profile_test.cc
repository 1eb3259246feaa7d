#include "core/op_profile.h"

#include <thread>

#include "gtest/gtest.h"

namespace mcc {
namespace {

void Sleep(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

TEST(OpProfileTest, DisabledRecordsNothing) {
  OpProfile::Enable(false);
  OpProfile::Reset();
  { ScopedOpTimer t("gemm"); }
  EXPECT_TRUE(OpProfile::Snapshot().empty());
}

TEST(OpProfileTest, CountsOutermostCallsOnly) {
  OpProfile::Reset();
  OpProfile::Enable(true);
  for (int i = 0; i < 3; ++i) {
    ScopedOpTimer outer("attention");
    Sleep(0.002);
    ScopedOpTimer inner("gemm");  // Nested: counted in attention's time.
    Sleep(0.001);
  }
  { ScopedOpTimer t("gemm"); }
  OpProfile::Enable(false);
  const std::vector<OpProfile::Entry> e = OpProfile::Snapshot();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].op, "attention");  // Most time first.
  EXPECT_EQ(e[0].calls, 3);
  EXPECT_GE(e[0].seconds, 3 * 0.003);
  EXPECT_EQ(e[1].op, "gemm");
  EXPECT_EQ(e[1].calls, 1);
  EXPECT_LT(e[1].seconds, e[0].seconds);
}

TEST(OpProfileTest, FormatGivesSharesAndTimeOutsideOps) {
  std::vector<OpProfile::Entry> e = {
      {"gemm", 4, 0.060}, {"norm", 2, 0.020}, {"dropout", 1, 0.010}};
  const std::string s = OpProfile::Format(e, 0.100, 2);
  EXPECT_EQ(s,
            "gemm 60.0 ms (60.0%), norm 20.0 ms (20.0%), 1 other ops 10.0 ms "
            "(10.0%), outside ops 10.0 ms (10.0%)");
}

}  // namespace
}  // namespace mcc
