#include "data/huggingface_tokenizer.h"

#include <map>
#include <sstream>

#include "absl/strings/str_split.h"
#include "core/json_document.h"
#include "data/test_util.h"
#include "data/tokenizer.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

std::string Testdata(const std::string& name) {
  return testing::Runfile("data/testdata/" + name);
}

std::unique_ptr<Tokenizer> Load(const std::string& name) {
  auto t = CreateTokenizer("HuggingFaceTokenizer",
                           TokenizerFiles{"", "", Testdata(name + ".json")});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : nullptr;
}

// data/testdata/hf_fixture.jsonl holds, for three small tokenizer.json files
// (GPT-2's, Llama 3's and Qwen 2's layouts), texts and the ids that Hugging
// Face's own JavaScript tokenizer (@huggingface/tokenizers 0.2.0) gives them;
// data/testdata/gen_hf_fixture.js wrote both.
TEST(HuggingFaceTokenizer, MatchesHuggingFaceTokenizersJs) {
  std::map<std::string, std::unique_ptr<Tokenizer>> tokenizers;
  std::istringstream in(testing::ReadAll(Testdata("hf_fixture.jsonl")));
  std::string line;
  std::map<std::string, int> checked;
  while (std::getline(in, line)) {
    auto record = ParseJsonDocument(line);
    ASSERT_TRUE(record.ok()) << record.status();
    const std::string name = (*record)["tokenizer"].get<std::string>();
    const std::string text = (*record)["text"].get<std::string>();
    const std::vector<int32_t> want =
        (*record)["ids"].get<std::vector<int32_t>>();
    auto& t = tokenizers[name];
    if (t == nullptr) t = Load(name);
    ASSERT_NE(t, nullptr);
    std::vector<int32_t> got;
    t->Encode(text, &got);
    EXPECT_EQ(got, want) << name << ": " << text;
    auto back = t->Decode(got);
    ASSERT_TRUE(back.ok()) << back.status();
    // hf_gpt2_small adds a space before each stretch between added tokens
    // (add_prefix_space), so only the others decode to the text itself.
    if (name != "hf_gpt2_small") {
      EXPECT_EQ(*back, text) << name;
    }
    ++checked[name];
  }
  EXPECT_EQ(checked.size(), 3u);
  for (const auto& [name, n] : checked) EXPECT_GE(n, 20) << name;
}

// GPT-2's encoder.json and vocab.bpe in tokenizer.json form: every id equals
// GPT2BPETokenizer's (with <|endoftext|> as the special token both make it).
TEST(HuggingFaceTokenizer, Gpt2InTokenizerJsonFormEqualsGPT2BPETokenizer) {
  auto encoder = ParseJsonDocument(
      testing::ReadAll(testing::Runfile("data/gpt2/encoder.json")));
  ASSERT_TRUE(encoder.ok());
  JsonDocument merges = JsonDocument::array();
  std::istringstream bpe(
      testing::ReadAll(testing::Runfile("data/gpt2/vocab.bpe")));
  std::string line;
  while (std::getline(bpe, line)) {
    if (!line.empty() && line[0] != '#') merges.push_back(line);
  }
  JsonDocument doc = {
      {"added_tokens",
       {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"model", {{"type", "BPE"}, {"vocab", *encoder}, {"merges", merges}}},
  };
  auto hf = MakeHuggingFaceTokenizerFromText(doc.dump(), "gpt2.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  auto gpt2 = MakeGPT2BPETokenizer(testing::Runfile("data/gpt2/encoder.json"),
                                   testing::Runfile("data/gpt2/vocab.bpe"));
  ASSERT_TRUE(gpt2.ok());
  EXPECT_EQ((*hf)->vocab_size(), 50257);
  EXPECT_EQ((*hf)->eod(), 50256);
  std::vector<std::string> texts =
      absl::StrSplit(testing::ReadAll(Testdata("multilingual.txt")), '\n');
  texts.push_back(testing::ReadAll(Testdata("multilingual.txt")));
  std::istringstream fixture(
      testing::ReadAll(Testdata("gpt2_encoder_fixture.jsonl")));
  while (std::getline(fixture, line)) {
    texts.push_back((*ParseJsonDocument(line))["text"].get<std::string>());
  }
  texts.push_back("a<|endoftext|>b <|endoftext|><|endoftext|>");
  for (const std::string& text : texts) {
    std::vector<int32_t> a, b;
    (*hf)->Encode(text, &a);
    (*gpt2)->EncodeWithSpecial(text, &b);
    EXPECT_EQ(a, b) << text;
  }
}

TEST(HuggingFaceTokenizer, AddedTokensAreLongestFirstAndEodIsNamed) {
  auto t = Load("hf_llama3_small");
  ASSERT_NE(t, nullptr);
  // 3256 <|begin_of_text|>, 3257 <|end_of_text|>, 3258 <|eot_id|>,
  // 3259 <|eot|>, 3260 tool_call (gen_hf_fixture.js).
  EXPECT_EQ(t->vocab_size(), 3261);
  EXPECT_EQ(t->eod(), 3257);
  std::vector<int32_t> ids;
  t->Encode("<|eot_id|><|eot|>", &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{3258, 3259}));
  // tokenizer_config.json beside the file chooses the eos token.
  const std::string dir = testing::TempDir("hf_config");
  testing::WriteAll(dir + "/tokenizer.json",
                    testing::ReadAll(Testdata("hf_llama3_small.json")));
  testing::WriteAll(dir + "/tokenizer_config.json",
                    R"({"eos_token": {"content": "<|eot_id|>"}})");
  auto chat = MakeHuggingFaceTokenizer(dir + "/tokenizer.json");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ((*chat)->eod(), 3258);
  auto clone = (*chat)->Clone();
  std::vector<int32_t> a, b;
  (*chat)->Encode("Clones share the vocabulary 123456", &a);
  clone->Encode("Clones share the vocabulary 123456", &b);
  EXPECT_EQ(a, b);
  EXPECT_FALSE(t->Decode(std::vector<int32_t>{3261}).ok());
}

// Digits: Llama 3 groups up to three, Qwen 2 one by one, GPT-2 a whole run.
TEST(SplitByPattern, FollowsEachPattern) {
  using V = std::vector<absl::string_view>;
  EXPECT_EQ(
      SplitByPattern(SplitPattern::kLlama3, "x 1234567 'RE(ab)\n\n  y"),
      (V{"x", " ", "123", "456", "7", " '", "RE", "(ab", ")\n\n", " ", " y"}));
  EXPECT_EQ(SplitByPattern(SplitPattern::kQwen2, "ab12"), (V{"ab", "1", "2"}));
  EXPECT_EQ(SplitByPattern(SplitPattern::kGpt2, "ab 12"), (V{"ab", " 12"}));
  EXPECT_EQ(SplitByPattern(SplitPattern::kLlama3, "it's  \n \n x"),
            (V{"it", "'s", "  \n \n", " x"}));
}

// A file this tokenizer cannot follow is an error naming the file and the
// part, never a different tokenization.
TEST(HuggingFaceTokenizer, RefusesWhatItDoesNotImplement) {
  auto base =
      ParseJsonDocument(testing::ReadAll(Testdata("hf_llama3_small.json")));
  ASSERT_TRUE(base.ok());
  struct Case {
    std::string what;
    std::function<void(JsonDocument&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"unknown regex",
       [](JsonDocument& d) {
         d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
       },
       "is not one this tokenizer implements"},
      {"normalizer",
       [](JsonDocument& d) {
         d["normalizer"] = {{"type", "NFC"}};
       },
       "normalizer \"NFC\" is not supported"},
      {"lstrip", [](JsonDocument& d) { d["added_tokens"][0]["lstrip"] = true; },
       "lstrip is not supported"},
      {"byte_fallback",
       [](JsonDocument& d) { d["model"]["byte_fallback"] = true; },
       "byte_fallback"},
      {"unigram", [](JsonDocument& d) { d["model"]["type"] = "Unigram"; },
       "model.type \"Unigram\""},
      {"missing byte", [](JsonDocument& d) { d["model"]["vocab"].erase("A"); },
       "no token for byte 65"},
      {"bad merge", [](JsonDocument& d) { d["model"]["merges"][5] = "x"; },
       "model.merges[5]"},
      {"no byte level",
       [](JsonDocument& d) {
         d["pre_tokenizer"] = d["pre_tokenizer"]["pretokenizers"][0];
       },
       "exactly one ByteLevel step"},
      {"metaspace",
       [](JsonDocument& d) {
         d["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       "\"Metaspace\" is not supported"},
      // Found by the hf_tokenizer fuzzer: one id, two texts, so the text
      // encoded as the first decoded as the second.
      {"added id twice",
       [](JsonDocument& d) {
         JsonDocument again = d["added_tokens"][0];
         again["content"] = "<|another|>";
         d["added_tokens"].push_back(again);
       },
       "is already"},
  };
  for (const Case& c : cases) {
    JsonDocument d = *base;
    c.mutate(d);
    auto t = MakeHuggingFaceTokenizerFromText(d.dump(), "my/tokenizer.json");
    ASSERT_FALSE(t.ok()) << c.what;
    const std::string m(t.status().message());
    EXPECT_NE(m.find("--tokenizer-model my/tokenizer.json: "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find(c.message), std::string::npos) << c.what << ": " << m;
  }
  EXPECT_FALSE(MakeHuggingFaceTokenizerFromText("{", "x.json").ok());
  auto missing = CreateTokenizer("HuggingFaceTokenizer",
                                 TokenizerFiles{"", "", "/nonexistent.json"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent.json"),
            std::string::npos);
}

}  // namespace
}  // namespace mcc::data
