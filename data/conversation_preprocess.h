#ifndef DATA_CONVERSATION_PREPROCESS_H_
#define DATA_CONVERSATION_PREPROCESS_H_

// preprocess_data --sft: a jsonl of conversations ({"messages": [...]}) to a
// Megatron indexed dataset of their tokens, each conversation one document,
// and its loss-mask companion (sample_dataset.h LossMaskPrefix): an indexed
// dataset of uint8 with the same sequence lengths, 1 on the tokens the loss
// trains on (each assistant message and the end-of-turn text the template
// writes after it), 0 elsewhere (and on an appended eod).

#include <string>

#include "absl/status/statusor.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "data/tokenizer_config.h"

namespace mcc::data {

struct ConversationPreprocessOptions {
  std::string input;          // --input file.jsonl
  std::string output_prefix;  // --output-prefix: writes
                              // <prefix>_messages_document{,_loss_mask}
  bool append_eod = false;    // --append-eod (masked out)
  bool skip_bad_records = false;
};

// Errors name the file and line. Outputs appear under their final names only
// when all went well.
absl::StatusOr<PreprocessStats> PreprocessConversations(
    const ConversationPreprocessOptions& options,
    const ChatTemplateConfig& chat, Tokenizer& tokenizer);

}  // namespace mcc::data

#endif  // DATA_CONVERSATION_PREPROCESS_H_
