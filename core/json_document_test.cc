#include "core/json_document.h"

#include <string>

#include "gtest/gtest.h"

namespace mcc {
namespace {

TEST(JsonDocument, ParsesWithExactIntegers) {
  auto doc = ParseJsonDocument(
      R"({"z": 1, "a": [9223372036854775807, 18446744073709551615, -1.5e-3],
          "s": "\u00e9\ud83d\ude00", "n": null, "t": true})");
  ASSERT_TRUE(doc.ok()) << doc.status();
  std::string order;
  for (const auto& [key, value] : doc->items()) order += key;
  EXPECT_EQ(order, "anstz");  // Sorted.
  EXPECT_EQ((*doc)["a"][0].get<int64_t>(), 9223372036854775807);
  EXPECT_EQ((*doc)["a"][1].get<uint64_t>(), 18446744073709551615u);
  EXPECT_DOUBLE_EQ((*doc)["a"][2].get<double>(), -1.5e-3);
  EXPECT_EQ((*doc)["s"].get<std::string>(), "\xc3\xa9\xf0\x9f\x98\x80");
}

TEST(JsonDocument, ErrorsNameLineAndColumn) {
  auto doc = ParseJsonDocument("{\n  \"a\": 1,\n  \"b\": tru }");
  ASSERT_FALSE(doc.ok());
  EXPECT_NE(doc.status().message().find("line 3, column"), std::string::npos)
      << doc.status();
  // No "[json.exception...]" tag in front.
  EXPECT_EQ(doc.status().message().find("json.exception"), std::string::npos)
      << doc.status();
}

TEST(JsonDocument, RejectsWhatNlohmannAloneWouldAccept) {
  auto dup =
      ParseJsonDocument(R"({"a": {"x": 1, "y": 2}, "b": {"x": 3, "x": 4}})");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("duplicate key \"x\""),
            std::string::npos)
      << dup.status();
  // The same key in sibling objects is fine.
  EXPECT_TRUE(ParseJsonDocument(R"([{"x": 1}, {"x": 2}])").ok());

  const std::string ok_deep =
      std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseJsonDocument(ok_deep).ok());
  auto deep = ParseJsonDocument("[" + ok_deep + "]");
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("nesting deeper"), std::string::npos)
      << deep.status();
}

TEST(JsonDocument, RejectsInvalidText) {
  for (const std::string& bad :
       {std::string("{\"a\": 1} x"), std::string("\"\\udc00\""),
        std::string("\"\\ud800\""), std::string("\"\xff\""),
        std::string("{\"a\": 1,}"), std::string("")}) {
    auto doc = ParseJsonDocument(bad);
    EXPECT_FALSE(doc.ok()) << bad;
    EXPECT_EQ(doc.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(JsonDocument, TypedMembersNameFileAndKey) {
  auto doc = ParseJsonDocument(
      R"({"i": 7, "big": 18446744073709551615, "f": 1.5, "s": "x", "b": true,
          "a": [1, 2], "bad": [1, "2"], "n": null})");
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ(*JsonIntMember(*doc, "i", 0, "f.json"), 7);
  EXPECT_EQ(*JsonIntMember(*doc, "absent", -3, "f.json"), -3);
  EXPECT_EQ(*JsonStringMember(*doc, "s", "", "f.json"), "x");
  EXPECT_EQ(*JsonStringMember(*doc, "absent", "d", "f.json"), "d");
  EXPECT_TRUE(*JsonBoolMember(*doc, "b", false, "f.json"));
  EXPECT_EQ(*JsonIntArrayMember(*doc, "a", "f.json"),
            (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(JsonIntArrayMember(*doc, "n", "f.json")->empty());
  struct Case {
    absl::Status status;
    std::string want;
  } cases[] = {
      {JsonIntMember(*doc, "s", 0, "f.json: entries[3]").status(),
       "f.json: entries[3]: \"s\" must be an integer within int64, found "
       "string"},
      {JsonIntMember(*doc, "big", 0, "f.json").status(), "\"big\" must be"},
      {JsonIntMember(*doc, "f", 0, "f.json").status(), "found number"},
      {JsonStringMember(*doc, "i", "", "f.json").status(),
       "\"i\" must be a string, found number"},
      {JsonBoolMember(*doc, "s", false, "f.json").status(), "true or false"},
      {JsonIntArrayMember(*doc, "bad", "f.json").status(),
       "\"bad\" must be an array of integers, found array"},
      {JsonIntArrayMember(*doc, "i", "f.json").status(), "found number"},
      {JsonIntMember((*doc)["a"], "x", 0, "f.json: a").status(),
       "f.json: a: expected a JSON object, found array"},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(absl::IsInvalidArgument(c.status)) << c.status;
    EXPECT_NE(c.status.message().find(c.want), std::string::npos)
        << c.status << " lacks " << c.want;
  }
}

}  // namespace
}  // namespace mcc
