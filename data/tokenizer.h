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

// Text to token ids and back. For ByteTokenizer and GPT2BPETokenizer,
// Decode(Encode(text)) == text for every valid UTF-8 text, Encode treats
// "<|endoftext|>" in the text as plain characters (as Megatron's
// preprocess_data.py does), EncodeWithSpecial turns it into eod(), and Decode
// renders eod() as "<|endoftext|>". SentencePieceTokenizer and
// HuggingFaceTokenizer follow their reference libraries instead (see their
// factories below).
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
  // Encode for a tokenizer that can fail (SentencePiece's library, whose
  // Encode aborts on failure): an error instead, with nothing appended. What
  // a server calls on a client's text.
  virtual absl::Status TryEncode(absl::string_view text,
                                 std::vector<int32_t>* out) {
    Encode(text, out);
    return absl::OkStatus();
  }
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

// A SentencePiece model file (--tokenizer-model), encoded and decoded by
// Debian's libsentencepiece itself: ids are the library's, Encode applies the
// model's normalization (so Decode(Encode(text)) == text only for models
// trained with the identity normalization and without whitespace removal),
// control symbols such as "</s>" in the text are plain characters, and
// Decode renders control ids as nothing. eod() is the model's eos id (an
// error when the model has none), as Megatron's SentencePieceTokenizer.
// Clones share the model; each may encode on its own thread.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeSentencePieceTokenizer(
    const std::string& model_file);
// Whether SentencePieceTokenizer works in this build: not under
// AddressSanitizer, which refuses the RTLD_DEEPBIND that isolates the
// library's clashing symbols (data/sentencepiece_shim.h). *why says why not.
bool SentencePieceAvailable(std::string* why);

// A Hugging Face tokenizer.json (--tokenizer-model) with a byte-level BPE
// model (GPT-2, Llama 3, Qwen 2 and many more): see huggingface_tokenizer.h.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeHuggingFaceTokenizer(
    const std::string& tokenizer_json);

// The files each --tokenizer-type reads.
struct TokenizerFiles {
  std::string vocab_file;       // --vocab-file: GPT2BPETokenizer
  std::string merge_file;       // --merge-file: GPT2BPETokenizer
  std::string tokenizer_model;  // --tokenizer-model: SentencePieceTokenizer,
                                //   HuggingFaceTokenizer
};

// The one factory behind train, eval and preprocess_data's
// --tokenizer-type: "GPT2BPETokenizer", "SentencePieceTokenizer",
// "HuggingFaceTokenizer" or "ByteTokenizer" (also "byte").
absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(
    absl::string_view type, const TokenizerFiles& files);
// The same without --tokenizer-model.
absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(
    absl::string_view type, const std::string& vocab_file,
    const std::string& merge_file);
// Which of the three file flags `type` reads ("vocab_file", "merge_file",
// "tokenizer_model"), for warnings about flags that have no effect.
bool TokenizerReadsFlag(absl::string_view type, absl::string_view flag);

// Offset of the first byte that is not part of valid UTF-8 (overlong forms,
// surrogates and code points past U+10FFFF are invalid), or npos.
size_t FindInvalidUtf8(absl::string_view text);

// GPT-2's pre-tokenization: splits text as the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does, returning the pieces (views into text).
std::vector<absl::string_view> GPT2PreTokenize(absl::string_view text);

}  // namespace mcc::data

#endif  // DATA_TOKENIZER_H_
