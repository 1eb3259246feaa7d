// Fuzzes data/json: a jsonl record (ExtractJsonStrings, as preprocess reads
// each line) and encoder.json's string-to-int object (ParseJsonStringToInt).
// Whatever the bytes, the readers return a status; a string they accept
// survives a round trip through AppendJsonString.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "data/json.h"
#include "glog/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> keys = {"text", "title", ""};
  std::vector<std::optional<std::string>> values;
  if (mcc::data::ExtractJsonStrings(text, keys, &values).ok()) {
    CHECK_EQ(values.size(), keys.size());
    std::string object = "{";
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!values[i].has_value()) continue;
      if (object.size() > 1) object += ",";
      mcc::data::AppendJsonString(keys[i], &object);
      object += ":";
      mcc::data::AppendJsonString(*values[i], &object);
    }
    object += "}";
    std::vector<std::optional<std::string>> again;
    CHECK(mcc::data::ExtractJsonStrings(object, keys, &again).ok()) << object;
    CHECK(again == values) << object;
  }
  std::vector<std::pair<std::string, int64_t>> entries;
  mcc::data::ParseJsonStringToInt(text, &entries).IgnoreError();
  return 0;
}
