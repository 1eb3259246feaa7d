#include "data/conversation.h"

#include <algorithm>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/json_document.h"
#include "core/status_macros.h"

namespace mcc::data {

absl::StatusOr<std::vector<ChatMessage>> ParseConversationRecord(
    absl::string_view json_line, absl::string_view where) {
  auto doc = ParseJsonDocument(json_line);
  if (!doc.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", doc.status().message()));
  }
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
  };
  if (!doc->is_object()) return bad("not a JSON object");
  auto m = doc->find("messages");
  if (m == doc->end() || !m->is_array()) {
    return bad("no \"messages\" list");
  }
  if (m->empty()) return bad("\"messages\" is empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m->size(); ++i) {
    const JsonDocument& msg = (*m)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!msg.is_object()) return bad(absl::StrCat(at, " is not an object"));
    auto role = msg.find("role");
    auto content = msg.find("content");
    if (role == msg.end() || !role->is_string()) {
      return bad(absl::StrCat(at, ".role is not a string"));
    }
    if (content == msg.end() || !content->is_string()) {
      return bad(absl::StrCat(at, ".content is not a string"));
    }
    out.push_back({role->get<std::string>(), content->get<std::string>()});
  }
  return out;
}

absl::StatusOr<TokenizedConversation> TokenizeConversation(
    const ChatTemplate& chat_template, const std::string& bos,
    const std::string& eos, const std::vector<ChatMessage>& messages,
    Tokenizer& tokenizer) {
  ChatTemplateInputs in;
  in.bos_token = bos;
  in.eos_token = eos;
  auto render = [&](size_t n,
                    bool generation_prompt) -> absl::StatusOr<std::string> {
    in.messages.assign(messages.begin(), messages.begin() + n);
    in.add_generation_prompt = generation_prompt;
    return chat_template.Render(in);
  };
  MCC_ASSIGN_OR_RETURN(const std::string full, render(messages.size(), false));
  // Assistant spans [begin, end) in bytes of `full`.
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    MCC_ASSIGN_OR_RETURN(const std::string before, render(i, true));
    MCC_ASSIGN_OR_RETURN(const std::string through, render(i + 1, false));
    if (!absl::StartsWith(full, before) || !absl::StartsWith(full, through) ||
        before.size() > through.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat template: messages[", i,
          "] (assistant): the rendering of the conversation up to it is not "
          "a prefix of the whole conversation's, so its tokens cannot be "
          "told apart (the template rewrites earlier turns as the "
          "conversation grows)"));
    }
    if (!spans.empty() && before.size() < spans.back().second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat template: messages[", i,
          "] (assistant) overlaps the assistant message before it"));
    }
    spans.emplace_back(before.size(), through.size());
  }
  std::set<size_t> cuts = {0, full.size()};
  for (const auto& [b, e] : spans) {
    cuts.insert(b);
    cuts.insert(e);
  }
  TokenizedConversation out;
  size_t span = 0;
  for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it) {
    const size_t b = *it, e = *std::next(it);
    while (span < spans.size() && spans[span].second <= b) ++span;
    const bool assistant = span < spans.size() && spans[span].first <= b &&
                           e <= spans[span].second;
    const size_t before = out.tokens.size();
    MCC_RETURN_IF_ERROR(tokenizer.TryEncode(
        absl::string_view(full).substr(b, e - b), &out.tokens));
    out.assistant_mask.resize(out.tokens.size(), 0);
    std::fill(out.assistant_mask.begin() + before, out.assistant_mask.end(),
              assistant ? 1 : 0);
  }
  return out;
}

}  // namespace mcc::data
