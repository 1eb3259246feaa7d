#ifndef DATA_JSON_H_
#define DATA_JSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/json_text.h"

namespace mcc::data {

// A small JSON reader for what the data pipeline reads: jsonl records and
// GPT-2's encoder.json. Errors name the byte offset in `text`.

// Parses `text` as one JSON object and returns, for each of `keys`, the
// decoded string value of that top-level member (nullopt when absent). A key
// whose value is not a string is an error. Escapes (\uXXXX with surrogate
// pairs included) are decoded to UTF-8; a lone surrogate is an error.
absl::Status ExtractJsonStrings(
    absl::string_view text, absl::Span<const std::string> keys,
    std::vector<std::optional<std::string>>* values);

// Parses a JSON object whose values are all integers.
absl::Status ParseJsonStringToInt(
    absl::string_view text, std::vector<std::pair<std::string, int64_t>>* out);

// Appends text to out as a JSON string literal (quotes included).
using ::mcc::AppendJsonString;

}  // namespace mcc::data

#endif  // DATA_JSON_H_
