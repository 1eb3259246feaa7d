#include "data/chat_template.h"

#include <ctime>
#include <string>

#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

using ::testing::HasSubstr;

ChatTemplate Load(const std::string& name) {
  const std::string text = testing::ReadAll(
      testing::Runfile("data/testdata/chat_templates/" + name));
  EXPECT_FALSE(text.empty()) << name;
  auto t = ChatTemplate::Parse(text);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

std::string Render(const ChatTemplate& t, std::vector<ChatMessage> messages,
                   bool add_generation_prompt, const std::string& bos,
                   const std::string& eos) {
  ChatTemplateInputs in;
  in.messages = std::move(messages);
  in.add_generation_prompt = add_generation_prompt;
  in.bos_token = bos;
  in.eos_token = eos;
  auto out = t.Render(in);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

std::string RenderText(const std::string& source,
                       ChatTemplateLimits limits = {}) {
  auto t = ChatTemplate::Parse(source, limits);
  if (!t.ok()) return "PARSE: " + std::string(t.status().message());
  auto out = t->Render({});
  if (!out.ok()) return "RENDER: " + std::string(out.status().message());
  return *out;
}

const std::vector<ChatMessage> kThreeTurns = {
    {"system", "You are terse."}, {"user", "Hi!"},
    {"assistant", "Hello."},      {"user", "Bye?"},
    {"assistant", "  Bye.  "},
};

TEST(ChatTemplateTest, Llama3) {
  const ChatTemplate t = Load("llama3.jinja");
  EXPECT_EQ(
      Render(t, kThreeTurns, false, "<|begin_of_text|>", "<|eot_id|>"),
      "<|begin_of_text|>"
      "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nBye?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nBye.<|eot_id|>");
  EXPECT_EQ(Render(t, {{"user", "Hi!"}}, true, "<|begin_of_text|>", ""),
            "<|begin_of_text|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Qwen25ChatMl) {
  const ChatTemplate t = Load("qwen2_5.jinja");
  EXPECT_EQ(Render(t, kThreeTurns, false, "", "<|im_end|>"),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\nBye?<|im_end|>\n"
            "<|im_start|>assistant\n  Bye.  <|im_end|>\n");
  // Without a system message the default one comes first.
  EXPECT_EQ(Render(t, {{"user", "Hi!"}}, true, "", "<|im_end|>"),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You "
            "are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\n");
  // Tool results: consecutive tool messages share one user turn.
  EXPECT_EQ(
      Render(t,
             {{"system", "S"}, {"user", "Q"}, {"tool", "r1"}, {"tool", "r2"}},
             false, "", ""),
      "<|im_start|>system\nS<|im_end|>\n"
      "<|im_start|>user\nQ<|im_end|>\n"
      "<|im_start|>user\n<tool_response>\nr1\n</tool_response>"
      "\n<tool_response>\nr2\n</tool_response><|im_end|>\n");
}

TEST(ChatTemplateTest, MistralAndItsRaisedException) {
  const ChatTemplate t = Load("mistral.jinja");
  EXPECT_EQ(
      Render(t, {{"user", "Hi!"}, {"assistant", "Hello."}, {"user", "Bye?"}},
             false, "<s>", "</s>"),
      "<s>[INST] Hi! [/INST]Hello.</s>[INST] Bye? [/INST]");
  ChatTemplateInputs in;
  in.messages = {{"user", "a"}, {"user", "b"}};
  auto out = t.Render(in);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("Conversation roles must alternate"));
  in.messages = {{"system", "a"}};
  EXPECT_THAT(std::string(t.Render(in).status().message()),
              HasSubstr("Conversation roles must alternate"));
}

TEST(ChatTemplateTest, Llama32WithTodaysDate) {
  const ChatTemplate t = Load("llama3_2.jinja");
  // strftime_now is defined, as in transformers: today's date.
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(date, sizeof(date), "%d %b %Y", &local);
  EXPECT_EQ(Render(t,
                   {{"system", " You are terse. "},
                    {"user", "Hi!"},
                    {"assistant", "Hello."},
                    {"user", "Bye?"}},
                   true, "<|begin_of_text|>", "<|eot_id|>"),
            std::string("<|begin_of_text|>"
                        "<|start_header_id|>system<|end_header_id|>\n\n"
                        "Cutting Knowledge Date: December 2023\n"
                        "Today Date: ") +
                date +
                "\n\nYou are terse.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nHello."
                "<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nBye?<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, WhitespaceControlAsTransformers) {
  // trim_blocks and lstrip_blocks on; {{ }} keeps its newline.
  EXPECT_EQ(RenderText("a\n  {% if true %}\n    b\n  {% endif %}\nc"),
            "a\n    b\nc");
  EXPECT_EQ(RenderText("{{ 'x' }}\ny"), "x\ny");
  EXPECT_EQ(RenderText("{# note #}\nz"), "z");
  EXPECT_EQ(RenderText("a  {{- 'x' -}}  \n y"), "axy");
  EXPECT_EQ(RenderText("a  {%+ if true %}b{% endif +%}\nc"), "a  b\nc");
}

TEST(ChatTemplateTest, Expressions) {
  EXPECT_EQ(
      RenderText("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 1 + 2 * 3 }}"),
      "3 -4 2 7");
  EXPECT_EQ(RenderText("{{ 'a' ~ 1 ~ none ~ true }}"), "a1NoneTrue");
  EXPECT_EQ(RenderText("{{ [1, 2, 3][-1] }} {{ 'hello'[1:3] }} "
                       "{{ [1,2,3,4][::-2] }}"),
            "3 el [4, 2]");
  EXPECT_EQ(RenderText("{{ 'b' in 'abc' }} {{ 4 not in [1] }} "
                       "{{ x is defined }} {{ 'y' if 0 else 'n' }}"),
            "True True False n");
  EXPECT_EQ(RenderText("{% for x in ['a','b','c'] %}{{ loop.index }}{{ x }}"
                       "{% if not loop.last %},{% endif %}{% endfor %}"),
            "1a,2b,3c");
  EXPECT_EQ(RenderText("{% for x in [] %}a{% else %}empty{% endfor %}"),
            "empty");
  // A set inside a loop stays in the loop; one in an if does not.
  EXPECT_EQ(RenderText("{% set v = 1 %}{% for x in [1] %}{% set v = 2 %}"
                       "{% endfor %}{{ v }}{% if true %}{% set v = 3 %}"
                       "{% endif %}{{ v }}"),
            "13");
  EXPECT_EQ(RenderText("{{ '  Hi  '.strip() | upper }}|{{ ' x ' | trim }}|"
                       "{{ [1,2] | length }}|{{ {'a': 1}.get('b', 9) }}|"
                       "{{ {'k': [1, 'v', none]} | tojson }}"),
            "HI|x|2|9|{\"k\": [1, \"v\", null]}");
  // Python's json.dumps(indent=2) layout.
  EXPECT_EQ(
      RenderText("{{ {'a': [1, {'b': none}], 'c': []} | tojson(indent=2) }}"),
      "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n"
      "  \"c\": []\n}");
  EXPECT_EQ(RenderText("{{ ['a', 'ci', 'b'] | reject('equalto', 'ci') | "
                       "join(', ') }}|{{ [1, none, 2] | select('none') | "
                       "length }}"),
            "a, b|1");
  EXPECT_EQ(RenderText("{{ 'x' | tojson(sort_keys=true) }}"),
            "RENDER: chat template: the keyword argument 'sort_keys' of the "
            "filter 'tojson' is not supported at 1:8");
  EXPECT_EQ(RenderText("{{ x.y }}"),
            "RENDER: chat template: 'y' of an "
            "undefined value at 1:5");
}

TEST(ChatTemplateTest, UnsupportedConstructsAreNamedWithTheirPosition) {
  EXPECT_EQ(RenderText("{% macro m() %}{% endmacro %}"),
            "PARSE: chat template: {% macro %} is not supported at 1:1");
  EXPECT_EQ(RenderText("ab\n{{ x | wordwrap }}"),
            "PARSE: chat template: the filter 'wordwrap' is not supported at "
            "2:6");
  EXPECT_EQ(RenderText("{% set ns = namespace(a=1) %}"),
            "PARSE: chat template: the function 'namespace' is not supported "
            "at 1:13");
  EXPECT_EQ(RenderText("{% set ns.a = 1 %}"),
            "PARSE: chat template: setting an attribute (namespace objects) is "
            "not supported at 1:10");
  EXPECT_EQ(RenderText("{{ 1.5 }}"),
            "PARSE: chat template: a float literal is not supported at 1:4");
  EXPECT_EQ(RenderText("{{ x is divisibleby(3) }}"),
            "PARSE: chat template: the test 'divisibleby' is not supported at "
            "1:6");
  EXPECT_EQ(RenderText("{{ x.format(1) }}"),
            "PARSE: chat template: the method 'format' is not supported at "
            "1:5");
  EXPECT_EQ(RenderText("{% if x %}"),
            "PARSE: chat template: missing {% elif %} at 1:11");
  EXPECT_THAT(RenderText("{{ 'a' "), HasSubstr("unclosed tag"));
  EXPECT_THAT(RenderText("{{ 'a }}"), HasSubstr("unclosed string"));
}

TEST(ChatTemplateTest, HostileTemplatesStopAtTheLimits) {
  EXPECT_THAT(RenderText("{% for i in range(100000000) %}{% endfor %}"),
              HasSubstr("range() longer than the limit"));
  EXPECT_THAT(RenderText("{% for i in range(1000000) %}{% for j in "
                         "range(1000000) %}{% endfor %}{% endfor %}"),
              HasSubstr("steps"));
  EXPECT_THAT(RenderText("{{ " + std::string(5000, '(') + "1" +
                         std::string(5000, ')') + " }}"),
              HasSubstr("nesting deeper than 64"));
  // Long chains nest as deep as parentheses do.
  std::string chain = "{{ 1";
  for (int i = 0; i < 10000; ++i) chain += " + 1";
  EXPECT_THAT(RenderText(chain + " }}"), HasSubstr("nesting deeper than 64"));
  std::string filters = "{{ 'a'";
  for (int i = 0; i < 10000; ++i) filters += " | trim";
  EXPECT_THAT(RenderText(filters + " }}"), HasSubstr("nesting deeper than 64"));
  std::string nested_chains = "{{ 1";
  for (int i = 0; i < 60; ++i) nested_chains += " + (1 + 1 + 1 + 1 + 1 + 1 + 1";
  EXPECT_THAT(RenderText(nested_chains + std::string(60, ')') + " }}"),
              HasSubstr("deeper than"));
  std::string nested;
  for (int i = 0; i < 5000; ++i) nested += "{% if true %}";
  EXPECT_THAT(RenderText(nested), HasSubstr("blocks nested deeper than 64"));
  ChatTemplateLimits small;
  small.max_output_bytes = 1000;
  EXPECT_THAT(RenderText("{% for i in range(1000) %}{{ 'xxxxxxxxxx' }}"
                         "{% endfor %}",
                         small),
              HasSubstr("output longer than 1000 bytes"));
  EXPECT_THAT(RenderText("{% set s = 'xxxxxxxxxxxxxxxxxxxxxx' %}"
                         "{% set s = s ~ s ~ s ~ s ~ s ~ s ~ s ~ s %}"
                         "{% set s = s ~ s ~ s ~ s ~ s ~ s ~ s ~ s %}",
                         small),
              HasSubstr("a string longer than 1000 bytes"));
}

}  // namespace
}  // namespace mcc::data
