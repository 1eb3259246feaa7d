#include "data/conversation.h"

#include <string>

#include "data/test_util.h"
#include "data/tokenizer.h"
#include "data/tokenizer_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

using ::testing::HasSubstr;

ChatTemplate Load(const std::string& name) {
  auto t = ChatTemplate::Parse(testing::ReadAll(
      testing::Runfile("data/testdata/chat_templates/" + name)));
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

// The decoded text of the tokens whose mask is `want`, runs joined by '|'.
std::string MaskedText(const Tokenizer& tok, const TokenizedConversation& c,
                       uint8_t want) {
  std::string out;
  std::vector<int32_t> run;
  auto flush = [&] {
    if (run.empty()) return;
    if (!out.empty()) out += "|";
    out += *tok.Decode(run);
    run.clear();
  };
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    if (c.assistant_mask[i] == want) {
      run.push_back(c.tokens[i]);
    } else {
      flush();
    }
  }
  flush();
  return out;
}

const char kThreeTurns[] =
    R"({"messages": [{"role": "system", "content": "Be brief."},)"
    R"( {"role": "user", "content": "Hi!"},)"
    R"( {"role": "assistant", "content": "Hello."},)"
    R"( {"role": "user", "content": "Bye?"},)"
    R"( {"role": "assistant", "content": "Bye."},)"
    R"( {"role": "user", "content": "Again?", "name": "ignored"},)"
    R"( {"role": "assistant", "content": "No."}]})";

TEST(ConversationTest, OnlyAssistantTurnsAreMarkedInLlama3) {
  auto messages = ParseConversationRecord(kThreeTurns, "t.jsonl:1");
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 7);
  auto tok = MakeByteTokenizer();
  auto c = TokenizeConversation(Load("llama3.jinja"), "<|begin_of_text|>",
                                "<|eot_id|>", *messages, *tok);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->tokens.size(), c->assistant_mask.size());
  EXPECT_EQ(MaskedText(*tok, *c, 1),
            "Hello.<|eot_id|>|Bye.<|eot_id|>|No.<|eot_id|>");
  // Bytes: one token each, so the count is the assistant text's length.
  int marked = 0;
  for (uint8_t m : c->assistant_mask) marked += m;
  EXPECT_EQ(marked, 3 * 10 + 6 + 4 + 3);  // "<|eot_id|>" is 10 bytes.
  EXPECT_THAT(MaskedText(*tok, *c, 0),
              HasSubstr("<|start_header_id|>user<|end_header_id|>\n\nBye?"));
}

TEST(ConversationTest, ChatMlWithAHuggingFaceTokenizer) {
  auto tok = CreateTokenizer(
      "HuggingFaceTokenizer",
      TokenizerFiles{"", "",
                     testing::Runfile("data/testdata/hf_qwen2_small.json")});
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto messages = ParseConversationRecord(kThreeTurns, "t.jsonl:1");
  auto c = TokenizeConversation(Load("qwen2_5.jinja"), "", "<|im_end|>",
                                *messages, **tok);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(MaskedText(**tok, *c, 1),
            "Hello.<|im_end|>\n|Bye.<|im_end|>\n|No.<|im_end|>\n");
  // <|im_end|> is one id, and the marked ones end assistant turns only.
  std::vector<int32_t> im_end;
  (*tok)->Encode("<|im_end|>", &im_end);
  ASSERT_EQ(im_end.size(), 1);
  int marked_ends = 0, ends = 0;
  for (size_t i = 0; i < c->tokens.size(); ++i) {
    if (c->tokens[i] != im_end[0]) continue;
    ++ends;
    marked_ends += c->assistant_mask[i];
  }
  EXPECT_EQ(ends, 7);
  EXPECT_EQ(marked_ends, 3);
}

TEST(ConversationTest, BadRecordsAndTemplatesAreNamed) {
  EXPECT_THAT(std::string(ParseConversationRecord(R"({"text": "x"})", "f:3")
                              .status()
                              .message()),
              HasSubstr("f:3: no \"messages\" list"));
  EXPECT_THAT(
      std::string(
          ParseConversationRecord(
              R"({"messages": [{"role": "user", "content": 1}]})", "f:4")
              .status()
              .message()),
      HasSubstr("f:4: messages[0].content is not a string"));
  // A template that puts the last message first is not prefix-stable.
  auto reversed = ChatTemplate::Parse(
      "{% for m in messages | reverse %}{{ m.content }};{% endfor %}");
  ASSERT_TRUE(reversed.ok());
  auto tok = MakeByteTokenizer();
  auto c = TokenizeConversation(
      *reversed, "", "",
      {{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}},
      *tok);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("messages[1] (assistant)"));
}

TEST(TokenizerConfigTest, ReadsTemplateAndTokens) {
  auto c = ParseTokenizerConfig(
      R"({"chat_template": "{{ bos_token }}x", "bos_token": "<s>",)"
      R"( "eos_token": {"content": "</s>", "lstrip": false}})",
      "tokenizer_config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, "{{ bos_token }}x");
  EXPECT_EQ(c->bos_token, "<s>");
  EXPECT_EQ(c->eos_token, "</s>");
  auto named = ParseTokenizerConfig(
      R"({"chat_template": [{"name": "tool_use", "template": "t"},)"
      R"( {"name": "default", "template": "d"}]})",
      "c.json");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->source, "d");
  EXPECT_THAT(
      std::string(ParseTokenizerConfig("{}", "c.json").status().message()),
      HasSubstr("c.json: no chat_template"));
  auto bad = ParseChatTemplateOf({"{% macro x %}", "", ""}, "c.json");
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("c.json: chat template: {% macro %} is not supported"));
}

}  // namespace
}  // namespace mcc::data
