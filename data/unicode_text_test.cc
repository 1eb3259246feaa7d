#include "data/unicode_text.h"

#include <vector>

#include "gtest/gtest.h"

namespace mcc::data {
namespace {

TEST(ClassifyTextTest, CodePointsClassesAndByteOffsets) {
  // "a", U+00E9 (2 bytes), "7", " ", U+4E2D (3 bytes), "!".
  const ClassifiedText t = ClassifyText(
      "a\xC3\xA9"
      "7 \xE4\xB8\xAD!");
  EXPECT_EQ(t.cps, (std::vector<uint32_t>{'a', 0xE9, '7', ' ', 0x4E2D, '!'}));
  EXPECT_EQ(t.cls, (std::vector<CharClass>{kLetter, kLetter, kNumber, kSpace,
                                           kLetter, kOther}));
  EXPECT_EQ(t.offs, (std::vector<size_t>{0, 1, 3, 4, 5, 8, 9}));
}

TEST(ClassifyTextTest, AByteThatIsNotUtf8IsOneOtherCharacter) {
  const ClassifiedText t = ClassifyText("a\xFF\xC3");
  EXPECT_EQ(t.cps, (std::vector<uint32_t>{'a', 0xFFFD, 0xFFFD}));
  EXPECT_EQ(t.cls, (std::vector<CharClass>{kLetter, kOther, kOther}));
  EXPECT_EQ(t.offs, (std::vector<size_t>{0, 1, 2, 3}));
}

TEST(ClassifyTextTest, EmptyTextHasOnlyTheEndOffset) {
  const ClassifiedText t = ClassifyText("");
  EXPECT_TRUE(t.cps.empty());
  EXPECT_EQ(t.offs, (std::vector<size_t>{0}));
}

}  // namespace
}  // namespace mcc::data
