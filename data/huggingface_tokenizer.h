#ifndef DATA_HUGGINGFACE_TOKENIZER_H_
#define DATA_HUGGINGFACE_TOKENIZER_H_

// Hugging Face tokenizer.json files with a byte-level BPE model: GPT-2's,
// Llama 3's, Qwen 2's layout and the many models that copy them. Written
// here because Debian packages no C++ tokenizer.json library.
//
// What a file may declare, and what is refused with an error naming the file
// (never a silent misreading):
//   model        type "BPE" with vocab (token -> id) and merges, either as
//                "a b" strings or as [a, b] lists; ignore_merges (a
//                pre-token that is itself in the vocabulary is one id, as
//                Llama 3 declares). Refused: byte_fallback, dropout,
//                continuing_subword_prefix, end_of_word_suffix.
//   normalizer   null only.
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex: GPT-2's regex),
//                alone or last in a Sequence after Split steps whose regex is
//                GPT-2's, Llama 3's or Qwen 2's (behavior Isolated, not
//                inverted). Any other pattern is refused.
//   added_tokens split out of the text before everything else, leftmost
//                first and longest first among those starting at one place,
//                special or not (as the library's encode does); lstrip,
//                rstrip and single_word are refused.
//   post_processor  not applied: Encode adds no BOS (Llama 3's template
//                would), as the library's encode(add_special_tokens=False).
//   decoder      Decode is the byte-level inverse; added tokens render as
//                their content.
// \s is Unicode's White_Space, \p{L} and \p{N} the general categories of
// data/unicode_tables.cc (Unicode 14). Bytes that are not UTF-8 go through
// as single characters of their own, byte-encoded.
//
// eod() is the tokenizer_config.json's eos_token when that file sits beside
// tokenizer.json, otherwise the first of <|endoftext|>, <|end_of_text|>,
// </s>, <eos>, <|im_end|> that the file has.
//
// A tokenizer instance is not thread-safe (it caches); Clone() gives another
// thread its own, sharing the vocabulary.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/tokenizer.h"

namespace mcc::data {

// From the file's text. `label` names the file in errors; `eos_token`, when
// not empty, chooses eod() (as tokenizer_config.json's eos_token).
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeHuggingFaceTokenizerFromText(
    absl::string_view json_text, const std::string& label,
    const std::string& eos_token = "");

// The pre-tokenizer regexes implemented here.
enum class SplitPattern {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+
            //   |\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+
            //   |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,   // Llama 3's with \p{N} (one digit) for \p{N}{1,3}
};

// Splits text as the pattern's matches do (every byte lands in one piece).
std::vector<absl::string_view> SplitByPattern(SplitPattern pattern,
                                              absl::string_view text);

}  // namespace mcc::data

#endif  // DATA_HUGGINGFACE_TOKENIZER_H_
