#include "checkpoint/flags.h"

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

TEST(CheckpointFlagsTest, ParsesAndChecks) {
  absl::SetFlag(&FLAGS_save, "/tmp/run");
  absl::SetFlag(&FLAGS_save_interval, 100);
  absl::SetFlag(&FLAGS_keep_last, 3);
  auto f = CheckpointFlagsFromCommandLine();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->save, "/tmp/run");
  EXPECT_EQ(f->keep_last, 3);
  EXPECT_TRUE(f->ShouldSave(200, 1000));
  EXPECT_FALSE(f->ShouldSave(150, 1000));
  EXPECT_TRUE(f->ShouldSave(1000, 1000));

  absl::SetFlag(&FLAGS_save, "");
  f = CheckpointFlagsFromCommandLine();
  EXPECT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("--save-interval"), std::string::npos);
  absl::SetFlag(&FLAGS_save_interval, 0);
  f = CheckpointFlagsFromCommandLine();
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->ShouldSave(1000, 1000));
}

}  // namespace
}  // namespace mcc
