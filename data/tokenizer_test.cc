#include "data/tokenizer.h"

#include <sstream>

#include "core/json_document.h"
#include "data/test_util.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

std::unique_ptr<Tokenizer> Gpt2() {
  auto t = MakeGPT2BPETokenizer(testing::Runfile("data/gpt2/encoder.json"),
                                testing::Runfile("data/gpt2/vocab.bpe"));
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

TEST(ByteTokenizer, RoundTripsAnyBytes) {
  auto t = MakeByteTokenizer();
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  std::vector<int32_t> ids;
  t->Encode(all, &ids);
  ASSERT_EQ(ids.size(), 256u);
  EXPECT_EQ(*t->Decode(ids), all);
  EXPECT_EQ(t->vocab_size(), 257);
  EXPECT_EQ(*t->Decode(std::vector<int32_t>{104, 105, 256}), "hi<|endoftext|>");
  EXPECT_FALSE(t->Decode(std::vector<int32_t>{257}).ok());
}

// data/testdata/gpt2_encoder_fixture.jsonl holds strings and the ids that
// gpt-3-encoder 1.1.4's own JavaScript encoder gives them (written by
// data/testdata/gen_gpt2_fixture.js under node).
TEST(GPT2BPETokenizer, MatchesGpt3EncoderJs) {
  auto t = Gpt2();
  EXPECT_EQ(t->vocab_size(), 50257);
  EXPECT_EQ(t->eod(), 50256);
  std::istringstream in(testing::ReadAll(
      testing::Runfile("data/testdata/gpt2_encoder_fixture.jsonl")));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    auto record = ParseJsonDocument(line);
    ASSERT_TRUE(record.ok()) << record.status();
    const std::string text = (*record)["text"].get<std::string>();
    const std::vector<int32_t> want =
        (*record)["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got;
    t->Encode(text, &got);
    EXPECT_EQ(got, want) << text;
    EXPECT_EQ(*t->Decode(got), text);
    ++n;
  }
  EXPECT_EQ(n, 15);
}

TEST(GPT2BPETokenizer, EndOfTextIsLiteralUnlessAskedFor) {
  auto t = Gpt2();
  std::vector<int32_t> plain, special;
  t->Encode("a<|endoftext|>b", &plain);
  t->EncodeWithSpecial("a<|endoftext|>b", &special);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(special.size(), 3u);
  EXPECT_EQ(special[1], 50256);
  EXPECT_EQ(*t->Decode(special), "a<|endoftext|>b");
  EXPECT_EQ(*t->Decode(plain), "a<|endoftext|>b");
}

TEST(GPT2BPETokenizer, CloneSharesVocabulary) {
  auto t = Gpt2();
  auto c = t->Clone();
  std::vector<int32_t> a, b;
  t->Encode("Shared vocabulary, separate caches.", &a);
  c->Encode("Shared vocabulary, separate caches.", &b);
  EXPECT_EQ(a, b);
}

TEST(PreTokenize, FollowsThePattern) {
  auto pieces = [](absl::string_view s) {
    std::vector<std::string> out;
    for (auto p : GPT2PreTokenize(s)) out.emplace_back(p);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("I'm here"), (V{"I", "'m", " here"}));
  EXPECT_EQ(pieces("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(pieces("a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("x  "), (V{"x", "  "}));
  EXPECT_EQ(pieces("abc123 45!?"), (V{"abc", "123", " 45", "!?"}));
  EXPECT_EQ(pieces("caf\xc3\xa9 \xe2\x80\x94 ok"),
            (V{"caf\xc3\xa9", " \xe2\x80\x94", " ok"}));
}

TEST(Utf8, FindsTheFirstBadByte) {
  EXPECT_EQ(FindInvalidUtf8("plain"), absl::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("ok \xc3\xa9 \xf0\x9f\x98\x80"),
            absl::string_view::npos);
  EXPECT_EQ(FindInvalidUtf8("ab\xff"), 2u);
  EXPECT_EQ(FindInvalidUtf8("a\xc0\x80"), 1u);      // overlong
  EXPECT_EQ(FindInvalidUtf8("a\xed\xa0\x80"), 1u);  // surrogate
  EXPECT_EQ(FindInvalidUtf8("\xe2\x80"), 0u);       // truncated
}

TEST(CreateTokenizer, UnknownTypeAndMissingFilesAreNamed) {
  auto a = CreateTokenizer("SentencePiece", "", "");
  EXPECT_NE(a.status().message().find("SentencePiece"), std::string::npos);
  auto b = CreateTokenizer("GPT2BPETokenizer", "/no/vocab.json", "/no/m.bpe");
  EXPECT_NE(b.status().message().find("--vocab-file"), std::string::npos);
}

}  // namespace
}  // namespace mcc::data
