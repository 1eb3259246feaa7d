// Fuzzes one jsonl line as preprocess_data reads it (TokenizeJsonlRecord,
// simdjson) with GPT-2's real vocabulary: any line gives the ids of its
// "text" key or an error naming the file and line; accepted text decodes
// back from its ids to the string nlohmann-json finds under "text".

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "core/json_document.h"
#include "core/testing/fuzz/runfiles.h"
#include "data/jsonl_record.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "glog/logging.h"

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
  mcc::data::JsonlRecordReader reader;
  absl::Status s = mcc::data::TokenizeJsonlRecord(options, "in.jsonl", 7, line,
                                                  reader, **tokenizer, &ids);
  if (!s.ok()) {
    CHECK(absl::StartsWith(s.message(), "in.jsonl:7: ")) << s;
    return 0;
  }
  CHECK_EQ(ids.size(), 1u);
  CHECK(!ids[0].empty() && ids[0].back() == (*tokenizer)->eod());
  ids[0].pop_back();
  auto text = (*tokenizer)->Decode(ids[0]);
  CHECK(text.ok()) << text.status();
  // An independent reading of the record (records with a repeated key are
  // left out: nlohmann keeps the last, simdjson the first).
  auto doc = mcc::ParseJsonDocument(line);
  if (doc.ok()) CHECK_EQ(*text, (*doc)["text"].get<std::string>());
  return 0;
}
