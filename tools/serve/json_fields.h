#ifndef TOOLS_SERVE_JSON_FIELDS_H_
#define TOOLS_SERVE_JSON_FIELDS_H_

// Typed reads of optional fields of a JSON request object, each error naming
// the field and the type it must have.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace serve {

// The body as a JSON object (an error for anything else).
absl::StatusOr<nlohmann::json> ParseJsonObject(absl::string_view body);

// Each leaves *out alone when the field is absent (or null).
absl::Status ReadInt(const nlohmann::json& obj, const char* name, int64_t* out);
absl::Status ReadNumber(const nlohmann::json& obj, const char* name,
                        double* out);
absl::Status ReadBool(const nlohmann::json& obj, const char* name, bool* out);

// The sampling fields of OpenAI's completion and chat requests, checked:
// temperature in [0, 2], top_p in (0, 1], top_k >= 0 (ours), stop a string
// or a list of at most 4 strings. Absent (or null) fields leave their
// outputs alone; errors name the field.
absl::Status ReadSamplingFields(const nlohmann::json& obj, double* temperature,
                                double* top_p, int* top_k,
                                std::vector<std::string>* stop);

// Text safe for JSON: invalid UTF-8 replaced (U+FFFD), as the dump does.
std::string Dump(const nlohmann::json& value);

}  // namespace serve
}  // namespace mcc

#endif  // TOOLS_SERVE_JSON_FIELDS_H_
