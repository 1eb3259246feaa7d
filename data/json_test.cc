#include "data/json.h"

#include <limits>

#include "gtest/gtest.h"

namespace mcc::data {
namespace {

TEST(Json, ExtractsStringsAndSkipsOtherValues) {
  std::vector<std::optional<std::string>> v;
  const std::vector<std::string> keys = {"text", "title", "absent"};
  ASSERT_TRUE(ExtractJsonStrings(
                  R"({"id": 12, "meta": {"a": [1, 2, {"b": null}]}, )"
                  R"("text": "a\"b\\c\n\u00e9\ud83d\ude00", "title": "t"})",
                  keys, &v)
                  .ok());
  EXPECT_EQ(*v[0], "a\"b\\c\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(*v[1], "t");
  EXPECT_FALSE(v[2].has_value());
}

TEST(Json, ErrorsNameTheByteOffset) {
  std::vector<std::optional<std::string>> v;
  const std::vector<std::string> keys = {"text"};
  absl::Status s = ExtractJsonStrings(R"({"text": "abc)", keys, &v);
  EXPECT_NE(s.message().find("unterminated"), std::string::npos) << s;
  s = ExtractJsonStrings(R"({"text": 5})", keys, &v);
  EXPECT_NE(s.message().find("not a string"), std::string::npos) << s;
  s = ExtractJsonStrings(R"({"text": "\udc00"})", keys, &v);
  EXPECT_NE(s.message().find("surrogate"), std::string::npos) << s;
  s = ExtractJsonStrings(R"({"a": 1} x)", keys, &v);
  EXPECT_NE(s.message().find("byte offset 9"), std::string::npos) << s;
}

TEST(Json, RoundTripsThroughAppendJsonString) {
  const std::string text = "line\none \"quoted\" \\ \x01 tab\t end";
  std::string json = "{\"text\": ";
  AppendJsonString(text, &json);
  json += "}";
  std::vector<std::optional<std::string>> v;
  ASSERT_TRUE(ExtractJsonStrings(json, {std::string("text")}, &v).ok());
  EXPECT_EQ(*v[0], text);
}

// Found by //data/fuzz:jsonl_record_fuzz_test (signed overflow in the
// integer reader).
TEST(Json, IntegersOutsideInt64AreAnError) {
  std::vector<std::pair<std::string, int64_t>> out;
  ASSERT_TRUE(
      ParseJsonStringToInt(
          R"({"a": 9223372036854775807, "b": -9223372036854775808})", &out)
          .ok());
  EXPECT_EQ(out[0].second, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(out[1].second, std::numeric_limits<int64_t>::min());
  absl::Status s = ParseJsonStringToInt(R"({"a": 9223372036854775808})", &out);
  EXPECT_NE(s.message().find("64-bit range"), std::string::npos) << s;
  s = ParseJsonStringToInt(R"({"a": 55555555555555555555555})", &out);
  EXPECT_NE(s.message().find("byte offset 6"), std::string::npos) << s;
  s = ParseJsonStringToInt(R"({"a": -})", &out);
  EXPECT_NE(s.message().find("expected an integer"), std::string::npos) << s;
}

}  // namespace
}  // namespace mcc::data
