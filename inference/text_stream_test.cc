#include "inference/text_stream.h"

#include "gtest/gtest.h"

namespace mcc {
namespace inference {
namespace {

TEST(TextStreamTest, SendsEverythingWithoutStopStrings) {
  TextStream s({});
  EXPECT_FALSE(s.Update("Hel"));
  EXPECT_EQ(s.TakeReady(false), "Hel");
  EXPECT_FALSE(s.Update("Hello"));
  EXPECT_EQ(s.TakeReady(false), "lo");
  EXPECT_EQ(s.TakeReady(true), "");
}

TEST(TextStreamTest, HoldsBackAPossibleStopStringAndCutsAtIt) {
  TextStream s({"END", "\n\n"});
  EXPECT_FALSE(s.Update("abc E"));
  EXPECT_EQ(s.TakeReady(false), "abc ");  // "E" may begin "END".
  EXPECT_FALSE(s.Update("abc EN"));
  EXPECT_EQ(s.TakeReady(false), "");
  EXPECT_FALSE(s.Update("abc ENx"));  // Not a stop after all.
  EXPECT_EQ(s.TakeReady(false), "ENx");
  EXPECT_TRUE(s.Update("abc ENx\n\nmore"));
  EXPECT_EQ(s.text(), "abc ENx");
  EXPECT_EQ(s.TakeReady(false), "");
  EXPECT_TRUE(s.stopped());
}

TEST(TextStreamTest, FirstStopStringWins) {
  TextStream s({"c", "b"});
  EXPECT_TRUE(s.Update("abcd"));
  EXPECT_EQ(s.text(), "a");
  EXPECT_EQ(s.TakeReady(true), "a");
}

TEST(TextStreamTest, NeverSplitsAUtf8Character) {
  TextStream s({});
  const std::string euro = "\xE2\x82\xAC";
  s.Update("a" + euro.substr(0, 2));
  EXPECT_EQ(s.TakeReady(false), "a");
  s.Update("a" + euro);
  EXPECT_EQ(s.TakeReady(false), euro);
  s.Update("a" + euro + "\xC3");
  EXPECT_EQ(s.TakeReady(false), "");
  EXPECT_EQ(s.TakeReady(true), "\xC3");  // The end sends what is left.
}

}  // namespace
}  // namespace inference
}  // namespace mcc
