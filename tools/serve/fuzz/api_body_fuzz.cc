// Fuzzes the HTTP request bodies of tools/serve's APIs as the handlers
// parse them: the first byte picks the API ('c': POST /v1/chat/completions,
// other even bytes: Megatron's PUT /api, other odd: POST /v1/completions),
// the rest is the body. Parsing never throws or
// crashes; an accepted request holds only values the engine takes (the
// checks below), and the answer formatters take its strings, valid UTF-8 or
// not, without throwing.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "data/chat_template.h"
#include "glog/logging.h"
#include "tools/serve/chat_completions_api.h"
#include "tools/serve/completions_api.h"
#include "tools/serve/megatron_api.h"

namespace {

void Megatron(absl::string_view body) {
  auto r = mcc::serve::ParseMegatronRequest(body);
  if (!r.ok()) {
    CHECK(!r.status().message().empty());
    return;
  }
  CHECK(!r->prompts.empty() && r->prompts.size() <= 128);
  CHECK_GE(r->tokens_to_generate, 0);
  CHECK(r->tokens_to_generate > 0 || r->logprobs);
  CHECK(r->temperature > 0 && r->temperature <= 100);
  CHECK(r->top_k >= 0 && r->top_k <= 1000);
  CHECK(r->top_p >= 0 && r->top_p <= 1);
  CHECK(!(r->top_k > 0 && r->top_p > 0));
  CHECK(!r->random_seed.has_value() || *r->random_seed >= 0);
  for (const std::string& p : r->prompts) CHECK(!p.empty() || r->add_BOS);
  mcc::serve::MegatronResult result;
  result.prompt = r->prompts[0];
  result.tokens = {1, 2};
  result.segments = {r->prompts[0], r->prompts.back()};
  result.logprobs = {-1.0};
  result.generated_text = r->prompts.back();
  const std::string out = mcc::serve::MegatronResponse({result}, r->logprobs);
  CHECK(!out.empty() && out.front() == '{');
}

void Completions(absl::string_view body) {
  auto r = mcc::serve::ParseCompletionRequest(body);
  if (!r.ok()) {
    CHECK(!r.status().message().empty());
    return;
  }
  CHECK(!r->prompts.empty() && r->prompts.size() <= 128);
  CHECK_GE(r->max_tokens, 1);
  CHECK(r->temperature >= 0 && r->temperature <= 2);
  CHECK(r->top_p > 0 && r->top_p <= 1);
  CHECK_GE(r->top_k, 0);
  CHECK_LE(r->stop.size(), 4u);
  CHECK(!r->logprobs.has_value() || (*r->logprobs >= 0 && *r->logprobs <= 5));
  mcc::serve::CompletionChoice choice;
  choice.text = r->prompts[0];
  choice.token_texts = r->stop;
  choice.token_logprobs.assign(r->stop.size(), -0.5);
  choice.finish_reason = "stop";
  CHECK(!mcc::serve::CompletionResponse("cmpl-1", 0, r->model, {choice},
                                        r->logprobs.has_value(), 1, 1)
             .empty());
  CHECK(!mcc::serve::CompletionStreamEvent("cmpl-1", 0, r->model, 0,
                                           r->prompts.back(), "")
             .empty());
}

// Chat requests, their messages rendered through Llama 3's template (the
// bounded interpreter: an error or text, never a crash or a hang).
void Chat(absl::string_view body) {
  auto r = mcc::serve::ParseChatCompletionRequest(body);
  if (!r.ok()) {
    CHECK(!r.status().message().empty());
    return;
  }
  CHECK(!r->messages.empty() && r->messages.size() <= 1024);
  CHECK(!r->max_tokens.has_value() || *r->max_tokens >= 1);
  CHECK(r->temperature >= 0 && r->temperature <= 2);
  CHECK(r->top_p > 0 && r->top_p <= 1);
  CHECK_GE(r->top_k, 0);
  CHECK_LE(r->stop.size(), 4u);
  for (const auto& s : r->stop) CHECK(!s.empty());
  static const mcc::data::ChatTemplate* const kLlama3 = [] {
    auto t = mcc::data::ChatTemplate::Parse(
        "{% set loop_messages = messages %}{% for message in loop_messages %}"
        "{% set content = '<|start_header_id|>' + message['role'] + "
        "'<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' "
        "%}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
        "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}");
    CHECK(t.ok()) << t.status();
    return new mcc::data::ChatTemplate(*t);
  }();
  mcc::data::ChatTemplateInputs in;
  in.messages = r->messages;
  in.add_generation_prompt = true;
  auto text = kLlama3->Render(in);
  if (text.ok()) CHECK(absl::EndsWith(*text, "<|end_header_id|>\n\n"));
  const std::string content = r->messages.back().content.substr(0, 64);
  CHECK(!mcc::serve::ChatCompletionResponse("c", 0, r->model, content, "stop",
                                            1, 1)
             .empty());
  CHECK(!mcc::serve::ChatStreamEvent("c", 0, r->model, true, content, "")
             .empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view body(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  if (data[0] == 'c') {  // 0x63, odd before chat existed
    Chat(body);
  } else if (data[0] % 2 == 0) {
    Megatron(body);
  } else {
    Completions(body);
  }
  return 0;
}
