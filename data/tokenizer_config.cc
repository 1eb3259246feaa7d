#include "data/tokenizer_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/json_document.h"
#include "core/status_macros.h"

namespace mcc::data {
namespace {

absl::StatusOr<std::string> TokenString(const JsonDocument& config,
                                        const char* key,
                                        const std::string& label) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return content->get<std::string>();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(label, ": ", key,
                   " is neither a string nor an object with a content string"));
}

}  // namespace

absl::StatusOr<ChatTemplateConfig> ParseTokenizerConfig(
    absl::string_view json_text, const std::string& label) {
  auto doc = ParseJsonDocument(json_text);
  if (!doc.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": ", doc.status().message()));
  }
  if (!doc->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": not a JSON object"));
  }
  ChatTemplateConfig c;
  auto t = doc->find("chat_template");
  if (t == doc->end() || t->is_null()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": no chat_template"));
  }
  if (t->is_string()) {
    c.source = t->get<std::string>();
  } else if (t->is_array()) {
    for (const JsonDocument& named : *t) {
      if (named.is_object() &&
          named.value("name", JsonDocument()) == JsonDocument("default")) {
        auto body = named.find("template");
        if (body != named.end() && body->is_string()) {
          c.source = body->get<std::string>();
        }
      }
    }
    if (c.source.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": chat_template lists no template named \"default\""));
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": chat_template is neither a string nor a list"));
  }
  MCC_ASSIGN_OR_RETURN(c.bos_token, TokenString(*doc, "bos_token", label));
  MCC_ASSIGN_OR_RETURN(c.eos_token, TokenString(*doc, "eos_token", label));
  return c;
}

absl::StatusOr<ChatTemplateConfig> ReadTokenizerConfig(
    const std::string& path) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) {
    p /= "tokenizer_config.json";
  } else if (p.extension() != ".json" || p.filename() == "tokenizer.json") {
    // A tokenizer file (tokenizer.json, a SentencePiece model): its sibling.
    p = p.parent_path() / "tokenizer_config.json";
  }
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(p.string(),
                     ": cannot open (the chat template is read "
                     "from tokenizer_config.json)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseTokenizerConfig(ss.str(), p.string());
}

absl::StatusOr<ChatTemplate> ParseChatTemplateOf(
    const ChatTemplateConfig& config, const std::string& label) {
  auto t = ChatTemplate::Parse(config.source);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": ", t.status().message()));
  }
  return t;
}

}  // namespace mcc::data
