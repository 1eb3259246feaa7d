#ifndef CHECKPOINT_JSON_H_
#define CHECKPOINT_JSON_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace json {

// A parsed JSON value: the small subset of a DOM that safetensors headers
// need. Numbers keep their text so integers up to 2^63 survive exactly.
struct Value {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;  // kNumber: the literal; kString: the decoded string.
  std::vector<Value> array;
  // Members in file order (duplicate keys are rejected by Parse).
  std::vector<std::pair<std::string, Value>> object;

  const Value* Find(absl::string_view key) const;  // Object member or null.
  absl::StatusOr<int64_t> AsInt() const;
};

// Parses one JSON document (trailing whitespace allowed).
absl::StatusOr<Value> Parse(absl::string_view text);

// `s` as a JSON string literal, quotes included.
std::string Quote(absl::string_view s);

}  // namespace json
}  // namespace mcc

#endif  // CHECKPOINT_JSON_H_
