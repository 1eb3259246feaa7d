// SentencePieceTokenizer against the library's own command-line encoder:
// models are trained here, at test time, with Debian's spm_train on the
// default corpus, and our ids must equal spm_encode's on a multilingual text.
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/default_corpus.h"
#include "data/test_util.h"
#include "data/tokenizer.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

class SentencePieceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!SentencePieceAvailable(&why)) GTEST_SKIP() << why;
  }

  // Trains <dir>/<name>.model with spm_train on the first documents of the
  // default corpus (one line each document line), with extra spm_train flags.
  static std::string Train(const std::string& name, const std::string& flags) {
    const std::string dir = testing::TempDir("spm_" + name);
    auto docs = LoadDefaultCorpusDocuments();
    EXPECT_TRUE(docs.ok()) << docs.status();
    std::string corpus;
    for (size_t i = 0; i < docs->size() && i < 4000; ++i) {
      absl::StrAppend(&corpus, (*docs)[i], "\n");
    }
    testing::WriteAll(dir + "/corpus.txt", corpus);
    const std::string prefix = dir + "/" + name;
    const std::string cmd = absl::StrCat(
        "spm_train --input=", dir, "/corpus.txt --model_prefix=", prefix,
        " --vocab_size=1500 --num_threads=2 ", flags, " --minloglevel=2 > ",
        dir, "/train.log 2>&1");
    EXPECT_EQ(std::system(cmd.c_str()), 0)
        << cmd << "\n"
        << testing::ReadAll(dir + "/train.log");
    return prefix + ".model";
  }

  // spm_encode's ids for each line of `input`.
  static std::vector<std::vector<int32_t>> SpmEncode(const std::string& model,
                                                     const std::string& input) {
    const std::string out = testing::TempDir("spm_encode") + "/ids.txt";
    const std::string cmd =
        absl::StrCat("spm_encode --model=", model, " --output_format=id < ",
                     input, " > ", out);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::vector<std::vector<int32_t>> result;
    for (const std::string& line : Lines(testing::ReadAll(out))) {
      std::vector<int32_t> ids;
      for (absl::string_view f : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        int32_t id;
        EXPECT_TRUE(absl::SimpleAtoi(f, &id)) << line;
        ids.push_back(id);
      }
      result.push_back(ids);
    }
    return result;
  }

  static std::string Multilingual() {
    return testing::Runfile("data/testdata/multilingual.txt");
  }
};

// A Llama-style model: BPE, identity normalization, whitespace kept, digits
// split, byte fallback for characters outside the vocabulary. Its ids equal
// spm_encode's line by line and decode back to every line exactly.
TEST_F(SentencePieceTest, LlamaStyleBpeMatchesSpmEncodeAndRoundTrips) {
  const std::string model =
      Train("llama_bpe",
            "--model_type=bpe --normalization_rule_name=identity "
            "--remove_extra_whitespaces=false --byte_fallback=true "
            "--split_digits=true --character_coverage=0.9995");
  auto t =
      CreateTokenizer("SentencePieceTokenizer", TokenizerFiles{"", "", model});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->name(), "SentencePieceTokenizer");
  EXPECT_EQ((*t)->vocab_size(), 1500);
  EXPECT_EQ((*t)->eod(), 2);  // spm_train's default </s>
  const std::vector<std::string> lines =
      Lines(testing::ReadAll(Multilingual()));
  const auto want = SpmEncode(model, Multilingual());
  ASSERT_EQ(want.size(), lines.size());
  int byte_pieces = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<int32_t> got;
    (*t)->Encode(lines[i], &got);
    EXPECT_EQ(got, want[i]) << lines[i];
    auto back = (*t)->Decode(got);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, lines[i]);
    for (int32_t id : got) byte_pieces += (id >= 3 && id < 3 + 256);
  }
  // The text reaches past the corpus's alphabet (CJK, emoji), so byte
  // fallback was exercised.
  EXPECT_GT(byte_pieces, 20);
  // A clone shares the model and encodes alike.
  auto clone = (*t)->Clone();
  std::vector<int32_t> a, b;
  (*t)->Encode(lines[2], &a);
  clone->Encode(lines[2], &b);
  EXPECT_EQ(a, b);
  // Ids outside the vocabulary are an error naming the id.
  auto bad = (*t)->Decode(std::vector<int32_t>{5, 1500});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("1500"), std::string::npos);
}

// spm_train's defaults: unigram with NFKC normalization and whitespace runs
// collapsed. Ids still equal the library CLI's.
TEST_F(SentencePieceTest, DefaultUnigramMatchesSpmEncode) {
  const std::string model =
      Train("unigram", "--input_sentence_size=20000 --character_coverage=1.0");
  auto t = MakeSentencePieceTokenizer(model);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<std::string> lines =
      Lines(testing::ReadAll(Multilingual()));
  const auto want = SpmEncode(model, Multilingual());
  ASSERT_EQ(want.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<int32_t> got;
    (*t)->Encode(lines[i], &got);
    EXPECT_EQ(got, want[i]) << lines[i];
  }
}

TEST(SentencePieceTokenizer, BadFilesAreErrorsNamingTheFlagAndFile) {
  auto missing = CreateTokenizer("SentencePieceTokenizer",
                                 TokenizerFiles{"", "", "/nonexistent.model"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--tokenizer-model"),
            std::string::npos);
  EXPECT_NE(missing.status().message().find("/nonexistent.model"),
            std::string::npos);
  const std::string garbage = testing::TempDir("spm_bad") + "/garbage.model";
  testing::WriteAll(garbage, "this is not a ModelProto");
  auto bad = MakeSentencePieceTokenizer(garbage);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(garbage), std::string::npos);
  auto none = CreateTokenizer("SentencePieceTokenizer", TokenizerFiles{});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("needs --tokenizer-model"),
            std::string::npos);
}

}  // namespace
}  // namespace mcc::data
