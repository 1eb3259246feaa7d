#include "data/jsonl_record.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace mcc::data {
namespace {

TEST(JsonlRecordReader, ReadsStringsAndSkipsOtherValues) {
  JsonlRecordReader reader;
  std::vector<std::optional<std::string_view>> v;
  const std::vector<std::string> keys = {"text", "title", "absent"};
  ASSERT_TRUE(
      reader
          .Read(R"({"id": 12, "meta": {"a": [1, 2, {"b": null}]}, )"
                R"("text": "a\"b\\c\n\u00e9\ud83d\ude00", "title": "t"})",
                keys, &v)
          .ok());
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(*v[0], "a\"b\\c\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(*v[1], "t");
  EXPECT_FALSE(v[2].has_value());
  // The reader is reused: a second, longer record reads as well.
  const std::string long_text(100000, 'x');
  ASSERT_TRUE(
      reader.Read(nlohmann::json{{"text", long_text}}.dump(), keys, &v).ok());
  EXPECT_EQ(*v[0], long_text);
  EXPECT_FALSE(v[1].has_value());
}

TEST(JsonlRecordReader, ErrorsSayWhatAndWhere) {
  JsonlRecordReader reader;
  std::vector<std::optional<std::string_view>> v;
  const std::vector<std::string> keys = {"text"};
  struct Case {
    std::string line, what;
  } cases[] = {
      {R"({"text": "abc)", "column 14"},
      {R"({"text": 5})", "value of key \"text\" is not a string"},
      {R"({"text": "\udc00"})", "surrogate"},
      {R"({"a": 1} x)", "column 10"},
      {"{\"text\": \"bad \xff byte\"}", "UTF-8"},
      {R"(["text", "a"])", "not a JSON object"},
      {R"({"text": "a",})", "invalid JSON at column"},
  };
  for (const Case& c : cases) {
    absl::Status s = reader.Read(c.line, keys, &v);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.line;
    EXPECT_NE(s.message().find(c.what), std::string::npos)
        << s << " for " << c.line;
  }
}

TEST(JsonlRecordReader, RoundTripsWhatNlohmannWrites) {
  const std::string text = "line\none \"quoted\" \\ \x01 tab\t end \xc3\xa9";
  JsonlRecordReader reader;
  std::vector<std::optional<std::string_view>> v;
  ASSERT_TRUE(reader
                  .Read(nlohmann::json{{"text", text}}.dump(),
                        {std::string("text")}, &v)
                  .ok());
  EXPECT_EQ(*v[0], text);
}

}  // namespace
}  // namespace mcc::data
