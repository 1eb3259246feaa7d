#include "data/preprocess.h"

#include "data/indexed_dataset.h"
#include "data/test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace mcc::data {
namespace {

const std::vector<std::string> kTexts = {
    "The first document.\nIt has two lines.",
    "Second: naïve café, “quotes” and 😀.",
    "  Whitespace   everywhere\t\t",
    "Numbers 1,234.5 and <|endoftext|> as plain text.",
};

std::string Jsonl(const std::vector<std::string>& texts) {
  std::string out;
  for (size_t i = 0; i < texts.size(); ++i) {
    // nlohmann::json is an ordinary map: keys come out sorted.
    out += nlohmann::json{{"id", i}, {"text", texts[i]}}.dump() + "\n";
  }
  return out;
}

void RoundTrip(const Tokenizer& tok, int workers) {
  const std::string dir = testing::TempDir("pre_rt_" + tok.name());
  testing::WriteAll(dir + "/in.jsonl", Jsonl(kTexts));
  PreprocessOptions o;
  o.input = dir + "/in.jsonl";
  o.output_prefix = dir + "/out";
  o.append_eod = true;
  o.workers = workers;
  auto stats = PreprocessJsonl(o, tok);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, 4);
  ASSERT_EQ(stats->output_prefixes[0], dir + "/out_text_document");
  auto ds = IndexedDataset::Open(stats->output_prefixes[0]);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_documents(), 4);
  for (int i = 0; i < 4; ++i) {
    std::vector<int64_t> ids = (*ds)->Get(i);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.back(), tok.eod());
    ids.pop_back();
    EXPECT_EQ(*tok.Decode(ids), kTexts[i]) << tok.name();
  }
}

TEST(Preprocess, RoundTripByte) { RoundTrip(*MakeByteTokenizer(), 2); }

TEST(Preprocess, RoundTripGpt2) {
  auto t = MakeGPT2BPETokenizer(testing::Runfile("data/gpt2/encoder.json"),
                                testing::Runfile("data/gpt2/vocab.bpe"));
  ASSERT_TRUE(t.ok()) << t.status();
  RoundTrip(**t, 3);
}

struct BadCase {
  std::string line, what;
};

TEST(Preprocess, BadRecordsNameTheLineOrAreSkipped) {
  const std::vector<BadCase> cases = {
      {"{\"title\": \"no text\"}", "missing key \"text\""},
      {"{\"text\": \"bad \xff byte\"}", "ill-formed UTF-8 byte"},
      {"{\"text\": \"\"}", "empty document"},
      {"{\"text\": \"unterminated}", "invalid JSON at column 24"},
      {"{\"text\": 7}", "value of key \"text\" is not a string"},
  };
  auto tok = MakeByteTokenizer();
  for (const BadCase& c : cases) {
    const std::string dir = testing::TempDir("pre_bad");
    testing::WriteAll(dir + "/in.jsonl", Jsonl({"good one", "good two"}) +
                                             c.line + "\n" +
                                             Jsonl({"good three"}));
    PreprocessOptions o;
    o.input = dir + "/in.jsonl";
    o.output_prefix = dir + "/out";
    auto s = PreprocessJsonl(o, *tok);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find(dir + "/in.jsonl:3: "),
              std::string::npos)
        << s.status();
    EXPECT_NE(s.status().message().find(c.what), std::string::npos)
        << s.status();
    // Nothing under the final names, and no temporaries left.
    EXPECT_EQ(std::system(("test \"$(ls " + dir + ")\" = in.jsonl").c_str()),
              0);

    o.skip_bad_records = true;
    auto k = PreprocessJsonl(o, *tok);
    ASSERT_TRUE(k.ok()) << k.status();
    EXPECT_EQ(k->documents, 3);
    EXPECT_EQ(k->skipped, 1);
  }
}

TEST(Preprocess, MissingInputIsNamed) {
  PreprocessOptions o;
  o.input = "/no/such.jsonl";
  o.output_prefix = testing::TempDir("pre_missing") + "/out";
  auto s = PreprocessJsonl(o, *MakeByteTokenizer());
  EXPECT_NE(s.status().message().find("/no/such.jsonl"), std::string::npos);
}

}  // namespace
}  // namespace mcc::data
