#include "data/conversation_preprocess.h"

#include <chrono>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "data/conversation.h"
#include "data/indexed_dataset.h"
#include "data/sample_dataset.h"

namespace mcc::data {

absl::StatusOr<PreprocessStats> PreprocessConversations(
    const ConversationPreprocessOptions& options,
    const ChatTemplateConfig& chat, Tokenizer& tokenizer) {
  const auto start = std::chrono::steady_clock::now();
  MCC_ASSIGN_OR_RETURN(ChatTemplate chat_template,
                       ParseChatTemplateOf(chat, "tokenizer_config.json"));
  std::ifstream in(options.input, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(options.input, ": cannot open for reading"));
  }
  const std::string prefix =
      PreprocessOutputPrefix(options.output_prefix, "messages");
  MCC_ASSIGN_OR_RETURN(auto tokens,
                       IndexedDatasetBuilder::Create(
                           prefix, OptimalTokenDType(tokenizer.vocab_size())));
  MCC_ASSIGN_OR_RETURN(auto mask,
                       IndexedDatasetBuilder::Create(LossMaskPrefix(prefix),
                                                     TokenDType::kUInt8));
  PreprocessStats stats;
  std::string line;
  int64_t line_no = 0;
  std::vector<int32_t> mask_values;
  while (std::getline(in, line)) {
    ++line_no;
    stats.input_bytes += static_cast<int64_t>(line.size()) + 1;
    if (line.empty()) continue;
    const std::string where = absl::StrCat(options.input, ":", line_no);
    absl::StatusOr<TokenizedConversation> c =
        [&]() -> absl::StatusOr<TokenizedConversation> {
      MCC_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages,
                           ParseConversationRecord(line, where));
      auto t = TokenizeConversation(chat_template, chat.bos_token,
                                    chat.eos_token, messages, tokenizer);
      if (!t.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", t.status().message()));
      }
      return t;
    }();
    if (c.ok() && c->tokens.empty()) {
      c = absl::InvalidArgumentError(
          absl::StrCat(where, ": the conversation renders to no tokens"));
    }
    if (!c.ok()) {
      if (options.skip_bad_records) {
        ++stats.skipped;
        continue;
      }
      return c.status();
    }
    if (options.append_eod) {
      c->tokens.push_back(static_cast<int32_t>(tokenizer.eod()));
      c->assistant_mask.push_back(0);
    }
    mask_values.assign(c->assistant_mask.begin(), c->assistant_mask.end());
    MCC_RETURN_IF_ERROR(tokens->AddDocument(c->tokens));
    MCC_RETURN_IF_ERROR(mask->AddDocument(mask_values));
    ++stats.documents;
    stats.tokens += static_cast<int64_t>(c->tokens.size());
  }
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(options.input, ": read error"));
  }
  MCC_RETURN_IF_ERROR(tokens->Finalize());
  MCC_RETURN_IF_ERROR(mask->Finalize());
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  stats.output_prefixes = {prefix, LossMaskPrefix(prefix)};
  return stats;
}

}  // namespace mcc::data
