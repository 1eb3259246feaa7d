#ifndef DATA_UNICODE_TEXT_H_
#define DATA_UNICODE_TEXT_H_

// UTF-8 decoding and the character classes that byte-level BPE
// pre-tokenizers (GPT-2's, Llama 3's, Qwen 2's regexes) are written in.
// Internal to //data's tokenizers.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace mcc::data {

// Decodes one code point at text[i]; returns its length, or 0 when the
// bytes there are not valid UTF-8 (overlong forms, surrogates and code
// points past U+10FFFF are invalid).
int DecodeUtf8(absl::string_view text, size_t i, uint32_t* cp);

// \p{L}, \p{N}, \s (Unicode White_Space) and everything else.
enum CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };
bool IsSpace(uint32_t cp);
CharClass Classify(uint32_t cp);

// Text as the characters a pre-tokenizer's pattern walks: the k-th has code
// point cps[k] and class cls[k] and starts at byte offs[k]; offs ends with
// the text's size. A byte that is not UTF-8 is a character of its own,
// U+FFFD of class kOther.
struct ClassifiedText {
  std::vector<uint32_t> cps;
  std::vector<CharClass> cls;
  std::vector<size_t> offs;
};
ClassifiedText ClassifyText(absl::string_view text);

// GPT-2's reversible map from bytes to printable code points, which
// byte-level BPE vocabularies are written in.
std::vector<uint32_t> BytesToUnicode();

}  // namespace mcc::data

#endif  // DATA_UNICODE_TEXT_H_
