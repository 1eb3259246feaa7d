// Fuzzes GPT-2 BPE vocabularies: an input is encoder.json, vocab.bpe and a
// text, joined by mcc::fuzz::kPartSeparator. Bad files must give an error;
// a tokenizer that loads must encode the text to ids inside its vocabulary
// that decode back to the text (the Tokenizer contract).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/testing/fuzz/fuzz_input.h"
#include "data/tokenizer.h"
#include "glog/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = mcc::fuzz::SplitParts(data, size, 3);
  auto tok = mcc::data::MakeGPT2BPETokenizerFromText(
      parts[0], parts[1], "encoder.json", "vocab.bpe");
  if (!tok.ok()) {
    CHECK(!tok.status().message().empty());
    return 0;
  }
  mcc::data::Tokenizer& t = **tok;
  std::vector<int32_t> ids;
  t.Encode(parts[2], &ids);
  for (int32_t id : ids) CHECK(id >= 0 && id < t.vocab_size()) << id;
  auto back = t.Decode(ids);
  CHECK(back.ok()) << back.status();
  CHECK_EQ(*back, parts[2]);
  ids.clear();
  t.EncodeWithSpecial(parts[2], &ids);
  CHECK(t.Decode(ids).ok());
  return 0;
}
