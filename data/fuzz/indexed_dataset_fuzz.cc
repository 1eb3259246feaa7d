// Fuzzes Megatron's .idx/.bin pair: an input is the .idx then the .bin,
// joined by mcc::fuzz::kPartSeparator. A pair that IndexedDataset accepts
// must be readable in full: every sequence lies inside the .bin (ASan checks
// the reads) and the counts agree with the index.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/testing/fuzz/fuzz_input.h"
#include "data/indexed_dataset.h"
#include "glog/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = mcc::fuzz::SplitParts(data, size, 2);
  // An exact-size copy, so that ASan sees any read past the .bin's end.
  std::unique_ptr<char[]> bin(new char[parts[1].size()]);
  std::memcpy(bin.get(), parts[1].data(), parts[1].size());
  auto ds = mcc::data::IndexedDataset::FromMemory(
      "fuzz", parts[0], absl::string_view(bin.get(), parts[1].size()));
  if (!ds.ok()) {
    CHECK(absl::string_view(ds.status().message()).find("fuzz.") !=
          absl::string_view::npos)
        << "error names no file: " << ds.status();
    return 0;
  }
  const mcc::data::IndexedDataset& d = **ds;
  int64_t tokens = 0;
  for (int64_t s = 0; s < d.num_sequences(); ++s) {
    tokens += d.Get(s).size();
  }
  CHECK_EQ(tokens, d.num_tokens());
  CHECK_GE(d.num_documents(), 0);
  return 0;
}
