#ifndef DATA_CONVERSATION_H_
#define DATA_CONVERSATION_H_

// Conversations for supervised fine-tuning: a jsonl record
// {"messages": [{"role": ..., "content": ...}, ...]} rendered with the
// model's chat template and tokenized, with a mask that marks the tokens the
// loss trains on: each assistant message's, with the end-of-turn text the
// template writes after it.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"

namespace mcc::data {

// The messages of one record. Each message needs string "role" and
// "content"; other members are ignored. Errors name `where` (file:line).
absl::StatusOr<std::vector<ChatMessage>> ParseConversationRecord(
    absl::string_view json_line, absl::string_view where);

struct TokenizedConversation {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> assistant_mask;  // 1: an assistant token
};

// Renders `messages` (add_generation_prompt off) and tokenizes the text.
// An assistant message i spans from the end of the rendering of messages
// [0, i) with the generation prompt to the end of the rendering of [0, i];
// both renderings must be prefixes of the whole one (true of templates
// whose earlier turns do not change as the conversation grows: Llama 3,
// ChatML/Qwen, Mistral without a system message), otherwise an error says
// which message. The text is tokenized piece by piece, cut at the spans'
// ends, so no token straddles a boundary. `bos`/`eos` are the template's
// bos_token/eos_token.
absl::StatusOr<TokenizedConversation> TokenizeConversation(
    const ChatTemplate& chat_template, const std::string& bos,
    const std::string& eos, const std::vector<ChatMessage>& messages,
    Tokenizer& tokenizer);

}  // namespace mcc::data

#endif  // DATA_CONVERSATION_H_
