#ifndef DATA_TOKENIZER_H_
#define DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mcc::data {

inline constexpr absl::string_view kEndOfText = "<|endoftext|>";

// Text to token ids and back. Decode(Encode(text)) == text for every valid
// UTF-8 text. Encode treats "<|endoftext|>" in the text as plain characters
// (as Megatron's preprocess_data.py does); EncodeWithSpecial turns it into
// eod(). Decode renders eod() as "<|endoftext|>".
//
// An instance is not thread-safe (it caches); Clone() gives another thread
// its own instance sharing the vocabulary.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t eod() const = 0;
  // Appends the ids of text to out. Bytes that are not valid UTF-8 are
  // encoded byte by byte (callers that must reject them check first with
  // FindInvalidUtf8).
  virtual void Encode(absl::string_view text, std::vector<int32_t>* out) = 0;
  virtual absl::StatusOr<std::string> Decode(
      absl::Span<const int64_t> ids) const = 0;
  virtual std::unique_ptr<Tokenizer> Clone() const = 0;

  void EncodeWithSpecial(absl::string_view text, std::vector<int32_t>* out);
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;
};

// ids 0..255 are the bytes; eod is 256; vocabulary 257. Needs no files.
std::unique_ptr<Tokenizer> MakeByteTokenizer();

// GPT-2's byte-level BPE from encoder.json (--vocab-file) and vocab.bpe
// (--merge-file). eod is the id of "<|endoftext|>" (50256 for GPT-2).
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeGPT2BPETokenizer(
    const std::string& vocab_file, const std::string& merge_file);
// The same from the files' contents; the names only label errors.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeGPT2BPETokenizerFromText(
    absl::string_view vocab_text, absl::string_view merge_text,
    const std::string& vocab_file, const std::string& merge_file);

// --tokenizer-type: "GPT2BPETokenizer" or "ByteTokenizer" (also "byte").
absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(
    absl::string_view type, const std::string& vocab_file,
    const std::string& merge_file);

// Offset of the first byte that is not part of valid UTF-8 (overlong forms,
// surrogates and code points past U+10FFFF are invalid), or npos.
size_t FindInvalidUtf8(absl::string_view text);

// GPT-2's pre-tokenization: splits text as the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does, returning the pieces (views into text).
std::vector<absl::string_view> GPT2PreTokenize(absl::string_view text);

}  // namespace mcc::data

#endif  // DATA_TOKENIZER_H_
