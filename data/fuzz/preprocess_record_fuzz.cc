// Fuzzes one jsonl line as preprocess_data reads it (TokenizeJsonlRecord)
// with GPT-2's real vocabulary: any line gives the ids of its "text" key or
// an error naming the file and line; accepted text decodes back from its
// ids.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "data/json.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "glog/logging.h"
#include "tools/fuzz/runfiles.h"

namespace {

std::unique_ptr<mcc::data::Tokenizer>* tokenizer = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* argv0 = *argc > 0 ? (*argv)[0] : nullptr;
  auto t = mcc::data::MakeGPT2BPETokenizer(
      mcc::fuzz::FuzzRunfile(argv0, "data/gpt2/encoder.json"),
      mcc::fuzz::FuzzRunfile(argv0, "data/gpt2/vocab.bpe"));
  CHECK(t.ok()) << t.status();
  tokenizer = new std::unique_ptr<mcc::data::Tokenizer>(std::move(t).value());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view line(reinterpret_cast<const char*>(data), size);
  mcc::data::PreprocessOptions options;
  options.json_keys = {"text"};
  options.append_eod = true;
  std::vector<std::vector<int32_t>> ids;
  absl::Status s = mcc::data::TokenizeJsonlRecord(options, "in.jsonl", 7, line,
                                                  **tokenizer, &ids);
  if (!s.ok()) {
    CHECK(absl::StartsWith(s.message(), "in.jsonl:7: ")) << s;
    return 0;
  }
  std::vector<std::optional<std::string>> values;
  CHECK(mcc::data::ExtractJsonStrings(line, options.json_keys, &values).ok());
  CHECK_EQ(ids.size(), 1u);
  for (size_t k = 0; k < ids.size(); ++k) {
    CHECK(!ids[k].empty() && ids[k].back() == (*tokenizer)->eod());
    ids[k].pop_back();
    auto text = (*tokenizer)->Decode(ids[k]);
    CHECK(text.ok()) << text.status();
    CHECK_EQ(*text, *values[k]);
  }
  return 0;
}
