#ifndef DATA_TOKENIZER_CONFIG_H_
#define DATA_TOKENIZER_CONFIG_H_

// What a Hugging Face tokenizer_config.json says about chat: its
// chat_template and the bos/eos tokens the template refers to.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/chat_template.h"

namespace mcc::data {

struct ChatTemplateConfig {
  std::string source;  // the Jinja text
  std::string bos_token;
  std::string eos_token;
};

// From the file's text; `label` names the file in errors. chat_template may
// be a string or transformers' list of {"name", "template"} (the one named
// "default" is taken); bos_token and eos_token a string, an AddedToken
// object ({"content": ...}) or absent/null (empty).
absl::StatusOr<ChatTemplateConfig> ParseTokenizerConfig(
    absl::string_view json_text, const std::string& label);

// The same from a file: a .json file other than tokenizer.json is read
// itself; a directory, or a tokenizer file (tokenizer.json, a SentencePiece
// model), names the tokenizer_config.json in it or beside it.
absl::StatusOr<ChatTemplateConfig> ReadTokenizerConfig(const std::string& path);

// ParseTokenizerConfig + ChatTemplate::Parse, errors naming `label`.
absl::StatusOr<ChatTemplate> ParseChatTemplateOf(
    const ChatTemplateConfig& config, const std::string& label);

}  // namespace mcc::data

#endif  // DATA_TOKENIZER_CONFIG_H_
