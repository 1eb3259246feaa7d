// Fuzzes Hugging Face tokenizer.json files: an input is the file and a text,
// joined by mcc::fuzz::kPartSeparator. A bad file must give an error naming
// it; a tokenizer that loads must encode the text to ids inside its
// vocabulary that decode back to the text, up to the spaces that ByteLevel's
// add_prefix_space inserts.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "core/testing/fuzz/fuzz_input.h"
#include "data/huggingface_tokenizer.h"
#include "glog/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = mcc::fuzz::SplitParts(data, size, 2);
  auto tok =
      mcc::data::MakeHuggingFaceTokenizerFromText(parts[0], "tokenizer.json");
  if (!tok.ok()) {
    CHECK(tok.status().message().find("tokenizer.json") != std::string::npos)
        << tok.status();
    return 0;
  }
  mcc::data::Tokenizer& t = **tok;
  CHECK(t.eod() >= 0 && t.eod() < t.vocab_size());
  std::vector<int32_t> ids;
  t.Encode(parts[1], &ids);
  for (int32_t id : ids) CHECK(id >= 0 && id < t.vocab_size()) << id;
  auto back = t.Decode(ids);
  CHECK(back.ok()) << back.status();
  if (*back != parts[1]) {
    CHECK_EQ(absl::StrReplaceAll(*back, {{" ", ""}}),
             absl::StrReplaceAll(parts[1], {{" ", ""}}));
  }
  // A clone encodes alike.
  std::vector<int32_t> again;
  t.Clone()->Encode(parts[1], &again);
  CHECK(again == ids);
  return 0;
}
