// Fuzzes the JSON readers data/ uses, against each other: a jsonl record as
// preprocess reads it (JsonlRecordReader, simdjson) and a JSON document as
// the tokenizer reads encoder.json (ParseJsonDocument, nlohmann-json).
//
// Whatever the bytes, both return a status. A record simdjson accepts is
// valid JSON to nlohmann as well, and (without repeated keys, which the two
// resolve differently) both find the same strings under the same keys. The
// strings accepted survive a round trip through nlohmann's writer.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/json_document.h"
#include "data/jsonl_record.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> keys = {"text", "title", ""};
  static mcc::data::JsonlRecordReader* reader =
      new mcc::data::JsonlRecordReader();
  std::vector<std::optional<std::string_view>> views;
  const absl::Status read = reader->Read(text, keys, &views);
  absl::StatusOr<mcc::JsonDocument> doc = mcc::ParseJsonDocument(text);
  if (!read.ok()) return 0;

  CHECK(nlohmann::json::accept(text.begin(), text.end()))
      << "simdjson accepts what nlohmann rejects: " << text;
  std::vector<std::optional<std::string>> values(views.begin(), views.end());
  if (doc.ok()) {
    for (size_t i = 0; i < keys.size(); ++i) {
      const bool has = doc->contains(keys[i]);
      CHECK_EQ(has, values[i].has_value()) << keys[i] << " in " << text;
      if (has) {
        CHECK((*doc)[keys[i]].get<std::string>() == *values[i]) << text;
      }
    }
  } else {
    // Only our own checks may reject a record simdjson accepts.
    const absl::string_view why = doc.status().message();
    CHECK(why.find("duplicate key") != absl::string_view::npos ||
          why.find("nesting deeper") != absl::string_view::npos)
        << doc.status() << " for " << text;
  }

  nlohmann::json object = nlohmann::json::object();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (values[i].has_value()) object[keys[i]] = *values[i];
  }
  const std::string line = object.dump();
  std::vector<std::optional<std::string_view>> again;
  CHECK(reader->Read(line, keys, &again).ok()) << line;
  for (size_t i = 0; i < keys.size(); ++i) {
    CHECK(again[i] == values[i]) << line;
  }
  return 0;
}
