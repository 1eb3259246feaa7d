// SentencePieceTokenizer: the Tokenizer interface over Debian's
// libsentencepiece (through SentencePieceModel, which keeps the library's
// header away from Abseil's).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/sentencepiece_model.h"
#include "data/tokenizer.h"

namespace mcc::data {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::shared_ptr<const SentencePieceModel> m)
      : m_(std::move(m)) {}
  std::string name() const override { return "SentencePieceTokenizer"; }
  int64_t vocab_size() const override { return m_->piece_size(); }
  int64_t eod() const override { return m_->eos_id(); }

  void Encode(absl::string_view text, std::vector<int32_t>* out) override {
    if (absl::Status s = TryEncode(text, out); !s.ok()) {
      // The library fails only for a model that did not load, which the
      // factory rules out; callers that take a client's text use TryEncode.
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      std::abort();
    }
  }

  absl::Status TryEncode(absl::string_view text,
                         std::vector<int32_t>* out) override {
    std::string error;
    if (!m_->Encode(std::string_view(text.data(), text.size()), &ids_,
                    &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SentencePieceTokenizer: Encode: ", error));
    }
    out->insert(out->end(), ids_.begin(), ids_.end());
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Decode(
      absl::Span<const int64_t> ids) const override {
    std::vector<int> narrow(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size()) {
        return absl::OutOfRangeError(absl::StrCat(
            "SentencePieceTokenizer: token ", ids[i], " at position ", i,
            " is outside the vocabulary of ", vocab_size()));
      }
      narrow[i] = static_cast<int>(ids[i]);
    }
    std::string text, error;
    if (!m_->Decode(narrow, &text, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SentencePieceTokenizer: Decode: ", error));
    }
    return text;
  }

  std::unique_ptr<Tokenizer> Clone() const override {
    return std::make_unique<SentencePieceTokenizer>(m_);
  }

 private:
  std::shared_ptr<const SentencePieceModel> m_;
  std::vector<int> ids_;  // reused between calls
};

}  // namespace

bool SentencePieceAvailable(std::string* why) {
  return SentencePieceModel::Available(why);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeSentencePieceTokenizer(
    const std::string& model_file) {
  std::string error;
  std::shared_ptr<const SentencePieceModel> m =
      SentencePieceModel::Load(model_file, &error);
  if (m == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer-model ", error));
  }
  if (m->eos_id() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer-model ", model_file,
        ": the model has no end-of-sentence piece (eos_id -1), which "
        "SentencePieceTokenizer uses as the end-of-document token"));
  }
  return std::unique_ptr<Tokenizer>(new SentencePieceTokenizer(std::move(m)));
}

}  // namespace mcc::data
