#ifndef CORE_JSON_DOCUMENT_H_
#define CORE_JSON_DOCUMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mcc {

// JSON documents the project reads from outside (config.json, encoder.json,
// the safetensors header) are parsed by nlohmann::json (Debian's
// nlohmann-json3-dev). This file adds the checks nlohmann does not make and
// turns its exceptions into a Status.
//
// Objects are std::maps: members come out sorted by key. (nlohmann's
// ordered_json would keep file order, but inserts into it are linear, so
// encoder.json's 50257 members would take seconds.)
using JsonDocument = nlohmann::json;

// Deeper nesting than this is rejected: no document read here nests past
// 3, and the limit bounds the memory a hostile file can make us allocate.
inline constexpr int kMaxJsonDepth = 128;

// Parses `text` as exactly one JSON document (whitespace around it allowed).
// Rejects, beyond nlohmann's syntax and UTF-8 checks: an object with the
// same key twice (nlohmann would keep the last silently) and nesting deeper
// than kMaxJsonDepth. Errors are InvalidArgument with a message such as
//   line 3, column 7: syntax error while parsing object key - ...
// that callers prefix with the file name. Thread-safe (no shared state).
absl::StatusOr<JsonDocument> ParseJsonDocument(absl::string_view text);

// Typed members of a JSON object read from outside. nlohmann's value() and
// get<>() throw type_error on a member of another type, which aborts a
// binary that does not catch it; these return InvalidArgument instead,
// naming `where` (the file, and the place inside it: "f.json: entries[3]")
// and the key. An absent member gives `fallback`; so does null where noted.
// `object` that is not an object is an error naming `where`.
absl::StatusOr<int64_t> JsonIntMember(const JsonDocument& object,
                                      absl::string_view key, int64_t fallback,
                                      absl::string_view where);
absl::StatusOr<std::string> JsonStringMember(const JsonDocument& object,
                                             absl::string_view key,
                                             absl::string_view fallback,
                                             absl::string_view where);
absl::StatusOr<bool> JsonBoolMember(const JsonDocument& object,
                                    absl::string_view key, bool fallback,
                                    absl::string_view where);
// An array of integers; absent or null: empty.
absl::StatusOr<std::vector<int64_t>> JsonIntArrayMember(
    const JsonDocument& object, absl::string_view key, absl::string_view where);

// nlohmann's exception text without its "[json.exception.parse_error.101]
// parse error at" tag: "line 3, column 7: syntax error ...".
std::string JsonErrorMessage(const nlohmann::json::exception& e);

}  // namespace mcc

#endif  // CORE_JSON_DOCUMENT_H_
