// The tracker rule: what a load finds, or refuses, in a checkpoint directory.
#include "checkpoint/checkpoint_dir.h"

#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/file_util.h"
#include "checkpoint/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using testing_util::FreshDir;
using testing_util::RandomTensor;

void Save(const std::string& dir, int64_t it, uint32_t seed) {
  ASSERT_TRUE(
      SaveCheckpoint(dir, it,
                     {ShardedTensorRef::Replicated(
                         "w", RandomTensor({4, 4}, DType::kFloat32, seed))},
                     {}, {}, DistContext::Single())
          .ok());
}

void ExpectMentions(const absl::Status& s, const std::string& what) {
  EXPECT_NE(s.message().find(what), std::string::npos)
      << "\"" << s.message() << "\" does not name " << what;
}

TEST(CheckpointDirTest, EmptyOrMissingDirectoryHoldsNoCheckpoint) {
  const std::string dir = FreshDir("empty");
  for (const std::string& d : {dir, dir + "/not_there"}) {
    auto found = FindCheckpointToLoad(d);
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_FALSE(found->has_value());
    // Only the auto-resume idiom (--load = --save) starts fresh.
    auto resume = ShouldResume(d, d, true);
    ASSERT_TRUE(resume.ok()) << resume.status();
    EXPECT_FALSE(*resume);
    resume = ShouldResume(d + "/", d, true);
    ASSERT_TRUE(resume.ok()) << resume.status();
    EXPECT_FALSE(*resume);
    for (const std::string& save : {std::string(), dir + "/elsewhere"}) {
      resume = ShouldResume(d, save, true);
      EXPECT_TRUE(absl::IsNotFound(resume.status())) << resume.status();
      ExpectMentions(resume.status(), "--load " + d + " holds no checkpoint");
    }
  }
  auto none = ShouldResume("", "", true);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(*none);
  // A dead writer's temporaries are no checkpoint.
  ASSERT_TRUE(file_util::MakeDirs(dir + "/iter_0000002.tmp").ok());
  auto found = FindCheckpointToLoad(dir);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_FALSE(found->has_value());
}

TEST(CheckpointDirTest, CorruptTrackerIsAnErrorNamingIt) {
  const std::string dir = FreshDir("corrupt_tracker");
  Save(dir, 3, 1);
  const std::string tracker = dir + "/" + kLatestFileName;
  for (const std::string& text : std::vector<std::string>{
           "", "x3\n", "-1\n", "3 4\n", std::string(1000, '\xff')}) {
    SCOPED_TRACE(text);
    ASSERT_TRUE(file_util::WriteFileAtomically(tracker, text).ok());
    auto found = FindCheckpointToLoad(dir);
    ASSERT_FALSE(found.ok());
    EXPECT_TRUE(absl::IsDataLoss(found.status())) << found.status();
    ExpectMentions(found.status(), tracker);
    // Never a fresh start, not even for the auto-resume idiom.
    auto resume = ShouldResume(dir, dir, true);
    ASSERT_FALSE(resume.ok());
    ExpectMentions(resume.status(), tracker);
    EXPECT_FALSE(CheckpointReader::Open(dir).ok());
  }
  // Unreadable: a directory in its place.
  ASSERT_TRUE(file_util::RemoveAll(tracker).ok());
  ASSERT_TRUE(file_util::MakeDirs(tracker).ok());
  auto resume = ShouldResume(dir, dir, true);
  ASSERT_FALSE(resume.ok());
  ExpectMentions(resume.status(), tracker);
}

TEST(CheckpointDirTest, UnlistableDirectoryIsAnError) {
  // A regular file where the directory should be: never taken for empty.
  const std::string file = FreshDir("unlistable") + "/file";
  ASSERT_TRUE(file_util::WriteFileAtomically(file, "x").ok());
  auto found = FindCheckpointToLoad(file);
  ASSERT_FALSE(found.ok());
  ExpectMentions(found.status(), "cannot list checkpoint directory " + file);
  EXPECT_FALSE(ShouldResume(file, file, true).ok());
  EXPECT_FALSE(RepairCheckpointDir(file).ok());
}

TEST(CheckpointDirTest, TrackerNamingAMissingOrIncompleteCheckpoint) {
  const std::string dir = FreshDir("inconsistent_tracker");
  Save(dir, 3, 1);
  const std::string tracker = dir + "/" + kLatestFileName;
  ASSERT_TRUE(file_util::WriteFileAtomically(tracker, "5\n").ok());
  auto found = FindCheckpointToLoad(dir);
  EXPECT_TRUE(absl::IsDataLoss(found.status())) << found.status();
  ExpectMentions(found.status(), tracker);
  ExpectMentions(found.status(), dir + "/iter_0000005");
  ExpectMentions(found.status(), "missing");
  EXPECT_FALSE(ShouldResume(dir, dir, true).ok());
  // Incomplete: no metadata.pb (and an incomplete .old beside it).
  ASSERT_TRUE(file_util::MakeDirs(dir + "/iter_0000005").ok());
  ASSERT_TRUE(file_util::MakeDirs(dir + "/iter_0000005.old").ok());
  found = FindCheckpointToLoad(dir);
  EXPECT_TRUE(absl::IsDataLoss(found.status())) << found.status();
  ExpectMentions(found.status(), dir + "/iter_0000005");
  ExpectMentions(found.status(), "incomplete");
  // Repair leaves what it cannot vouch for.
  ASSERT_TRUE(RepairCheckpointDir(dir).ok());
  EXPECT_TRUE(file_util::Exists(dir + "/iter_0000005.old"));
  EXPECT_TRUE(file_util::Exists(dir + "/iter_0000003/metadata.pb"));
}

TEST(CheckpointDirTest, MissingTrackerBesideCheckpointsIsAnError) {
  const std::string dir = FreshDir("no_tracker");
  Save(dir, 3, 1);
  const std::string tracker = dir + "/" + kLatestFileName;
  ASSERT_TRUE(file_util::RemoveAll(tracker).ok());
  auto found = FindCheckpointToLoad(dir);
  EXPECT_TRUE(absl::IsFailedPrecondition(found.status())) << found.status();
  ExpectMentions(found.status(), tracker);
  ExpectMentions(found.status(), "iter_0000003");
  // A fresh start would overwrite iteration 3: refused for auto-resume too.
  EXPECT_FALSE(ShouldResume(dir, dir, true).ok());
}

TEST(CheckpointDirTest, TrackerNamingACompleteCheckpoint) {
  const std::string dir = FreshDir("good");
  Save(dir, 3, 1);
  auto found = FindCheckpointToLoad(dir);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->iteration, 3);
  EXPECT_EQ((*found)->path, dir + "/iter_0000003");
  for (const std::string& save : {std::string(), dir, dir + "/x"}) {
    auto resume = ShouldResume(dir, save, true);
    ASSERT_TRUE(resume.ok()) << resume.status();
    EXPECT_TRUE(*resume);
  }
}

TEST(CheckpointDirTest, RepairRemovesTemporariesAndRestoresOld) {
  const std::string dir = FreshDir("repair");
  Save(dir, 3, 1);
  ASSERT_TRUE(file_util::MakeDirs(dir + "/iter_0000004.tmp/x").ok());
  ASSERT_TRUE(
      file_util::WriteFileAtomically(dir + "/" + kLatestFileName + ".tmp", "4")
          .ok());
  ASSERT_TRUE(
      file_util::Rename(dir + "/iter_0000003", dir + "/iter_0000003.old").ok());
  // Unrelated names stay.
  ASSERT_TRUE(file_util::MakeDirs(dir + "/iter_x.tmp").ok());
  ASSERT_TRUE(RepairCheckpointDir(dir).ok());
  EXPECT_FALSE(file_util::Exists(dir + "/iter_0000004.tmp"));
  EXPECT_FALSE(file_util::Exists(dir + "/" + kLatestFileName + ".tmp"));
  EXPECT_FALSE(file_util::Exists(dir + "/iter_0000003.old"));
  EXPECT_TRUE(file_util::Exists(dir + "/iter_0000003/metadata.pb"));
  EXPECT_TRUE(file_util::Exists(dir + "/iter_x.tmp"));
  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->ReadTensor("w")->ToDoubles(),
            RandomTensor({4, 4}, DType::kFloat32, 1).ToDoubles());
  EXPECT_TRUE(RepairCheckpointDir(dir + "/not_there").ok());
}

TEST(CheckpointDirTest, SameDirectory) {
  const std::string dir = FreshDir("same");
  EXPECT_TRUE(SameDirectory(dir, dir + "/"));
  EXPECT_TRUE(SameDirectory(dir, dir + "/./sub/.."));
  EXPECT_TRUE(SameDirectory(dir + "/new", dir + "/new//"));
  EXPECT_FALSE(SameDirectory(dir, dir + "/sub"));
}

}  // namespace
}  // namespace mcc
