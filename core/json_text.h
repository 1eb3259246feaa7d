#ifndef CORE_JSON_TEXT_H_
#define CORE_JSON_TEXT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace mcc {

// The text pieces the project's small JSON readers and writers share.

// Appends code point cp (at most U+10FFFF) to out as UTF-8.
void AppendUtf8(uint32_t cp, std::string* out);

// Appends text to out as a JSON string literal, quotes included: ", \ and
// control characters escaped, everything else byte for byte.
void AppendJsonString(absl::string_view text, std::string* out);

}  // namespace mcc

#endif  // CORE_JSON_TEXT_H_
