// The request parsers and answer formats of both APIs, without a server
// (serve_e2e_test checks them through HTTP with real clients).
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/serve/completions_api.h"
#include "tools/serve/megatron_api.h"

namespace mcc {
namespace serve {
namespace {

TEST(MegatronApiTest, ReadsEveryField) {
  auto r = ParseMegatronRequest(
      R"({"prompts": ["a", ""], "tokens_to_generate": 7, "temperature": 0.5,
          "top_p": 0.9, "random_seed": 3, "logprobs": true, "add_BOS": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts, (std::vector<std::string>{"a", ""}));
  EXPECT_EQ(r->tokens_to_generate, 7);
  EXPECT_EQ(r->temperature, 0.5);
  EXPECT_EQ(r->top_p, 0.9);
  EXPECT_EQ(r->top_k, 0);
  EXPECT_EQ(r->random_seed, 3);
  EXPECT_TRUE(r->logprobs);
  EXPECT_TRUE(r->add_BOS);
  auto defaults = ParseMegatronRequest(R"({"prompts": ["a"]})");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->tokens_to_generate, 64);
  EXPECT_EQ(defaults->temperature, 1.0);
  EXPECT_FALSE(defaults->random_seed.has_value());
}

TEST(MegatronApiTest, RefusesWithTheFieldNamed) {
  for (const auto& [body, words] :
       std::vector<std::pair<std::string, std::string>>{
           {"", "not valid JSON"},
           {"[]", "JSON object"},
           {"{}", "prompts is required"},
           {R"({"prompts": [1]})", "list of strings"},
           {R"({"prompts": ["a"], "top_k": 2, "top_p": 0.5})", "both"},
           {R"({"prompts": ["a"], "temperature": 0})", "temperature"},
           {R"({"prompts": ["a"], "tokens_to_generate": 0})", "logprobs"},
           {R"({"prompts": [""]})", "add_BOS"},
           {R"({"prompts": ["a"], "random_seed": -1})", "random_seed"},
           {R"({"prompts": ["a"], "tokens_to_generate": 1e3})", "integer"},
       }) {
    auto r = ParseMegatronRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find(words), std::string::npos)
        << body << ": " << r.status();
  }
}

TEST(MegatronApiTest, AnswerHasMegatronsFields) {
  MegatronResult r;
  r.prompt = "ab";
  r.tokens = {97, 98, 99};
  r.segments = {"a", "b", "c"};
  r.logprobs = {-1.5, -2.5};
  r.generated_text = "c";
  auto j = nlohmann::json::parse(MegatronResponse({r}, true));
  EXPECT_EQ(j["text"], nlohmann::json({"abc"}));
  EXPECT_EQ(j["segments"], nlohmann::json({{"a", "b", "c"}}));
  EXPECT_EQ(j["tokens"], nlohmann::json({{97, 98, 99}}));
  EXPECT_EQ(j["logprobs"], nlohmann::json({{-1.5, -2.5}}));
  EXPECT_FALSE(
      nlohmann::json::parse(MegatronResponse({r}, false)).contains("logprobs"));
  r.generated_text = "\xff";  // Invalid UTF-8 is replaced, not thrown.
  EXPECT_NE(MegatronResponse({r}, false).find("\xef\xbf\xbd"),
            std::string::npos);
}

TEST(CompletionsApiTest, ReadsEveryField) {
  auto r = ParseCompletionRequest(
      R"({"prompt": ["x", "y"], "max_tokens": 5, "temperature": 0,
          "top_p": 0.5, "stop": "\n", "seed": 9, "stream": true,
          "logprobs": 2, "model": "m", "n": 1, "ignore_eos": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(r->max_tokens, 5);
  EXPECT_EQ(r->temperature, 0);
  EXPECT_EQ(r->top_p, 0.5);
  EXPECT_EQ(r->stop, (std::vector<std::string>{"\n"}));
  EXPECT_EQ(r->seed, 9u);
  EXPECT_TRUE(r->stream);
  EXPECT_EQ(r->logprobs, 2);
  EXPECT_EQ(r->model, "m");
  EXPECT_TRUE(r->ignore_eos);
  auto one = ParseCompletionRequest(R"({"prompt": "x"})");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->max_tokens, 16);
  EXPECT_FALSE(one->stream);
}

TEST(CompletionsApiTest, RefusesWithTheFieldNamed) {
  for (const auto& [body, words] :
       std::vector<std::pair<std::string, std::string>>{
           {"{", "not valid JSON"},
           {R"({"max_tokens": 3})", "prompt is required"},
           {R"({"prompt": "x", "max_tokens": 0})", "at least 1"},
           {R"({"prompt": "x", "max_tokens": "3"})", "integer"},
           {R"({"prompt": "x", "temperature": -1})", "temperature"},
           {R"({"prompt": "x", "stop": [1]})", "stop"},
           {R"({"prompt": "x", "stream": 1})", "boolean"},
           {R"({"prompt": "x", "n": 3})", "n must be 1"},
       }) {
    auto r = ParseCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find(words), std::string::npos)
        << body << ": " << r.status();
  }
}

// The largest max_tokens JSON can carry reaches the engine intact, which
// refuses it against the context (engine_test, http_frontend_test); one past
// int64 is refused here.
TEST(CompletionsApiTest, Int64EdgeMaxTokens) {
  auto r = ParseCompletionRequest(
      R"({"prompt": "x", "max_tokens": 9223372036854775807})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_tokens, std::numeric_limits<int64_t>::max());
  r = ParseCompletionRequest(
      R"({"prompt": "x", "max_tokens": 9223372036854775808})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_tokens"), std::string::npos);
  auto m = ParseMegatronRequest(
      R"({"prompts": ["x"], "tokens_to_generate": 9223372036854775807})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tokens_to_generate, std::numeric_limits<int64_t>::max());
}

TEST(CompletionsApiTest, AnswerAndStreamEvents) {
  CompletionChoice c;
  c.text = "hi";
  c.token_texts = {"h", "i"};
  c.token_logprobs = {-0.5, -0.25};
  c.finish_reason = "length";
  auto j = nlohmann::json::parse(
      CompletionResponse("cmpl-7", 100, "gpt", {c}, true, 3, 2));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "hi");
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], nlohmann::json({0, 1}));
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
  const std::string event =
      CompletionStreamEvent("cmpl-7", 100, "gpt", 1, "h", "");
  ASSERT_EQ(event.rfind("data: ", 0), 0u);
  ASSERT_EQ(event.substr(event.size() - 2), "\n\n");
  auto e = nlohmann::json::parse(event.substr(6));
  EXPECT_TRUE(e["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(e["choices"][0]["index"], 1);
  EXPECT_EQ(std::string(kStreamDone), "data: [DONE]\n\n");
}

}  // namespace
}  // namespace serve
}  // namespace mcc
