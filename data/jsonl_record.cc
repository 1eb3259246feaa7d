#include "data/jsonl_record.h"

#include "absl/strings/str_cat.h"
#include "core/json_document.h"
#include "simdjson.h"

namespace mcc::data {
namespace {

// Why simdjson rejected `line`: nlohmann-json parses it again to say where
// (errors are rare, so the second parse costs nothing that matters). A
// jsonl record is one line, so the position is a column.
std::string WhereInvalid(absl::string_view line, simdjson::error_code error) {
  try {
    const nlohmann::json accepted =
        nlohmann::json::parse(line.begin(), line.end());
    (void)accepted;
  } catch (const nlohmann::json::exception& e) {
    std::string why = JsonErrorMessage(e);
    if (why.rfind("line 1, ", 0) == 0) why.erase(0, 8);
    return absl::StrCat("invalid JSON at ", why);
  }
  // nlohmann accepts what simdjson does not (a limit of simdjson's, such as
  // its nesting depth): simdjson's reason, without a position.
  return absl::StrCat("invalid JSON: ", simdjson::error_message(error));
}

}  // namespace

struct JsonlRecordReader::Parser {
  simdjson::dom::parser dom;
};

JsonlRecordReader::JsonlRecordReader() : parser_(std::make_unique<Parser>()) {}
JsonlRecordReader::~JsonlRecordReader() = default;

absl::Status JsonlRecordReader::Read(
    absl::string_view line, absl::Span<const std::string> keys,
    std::vector<std::optional<std::string_view>>* values) {
  values->assign(keys.size(), std::nullopt);
  simdjson::dom::element doc;
  // realloc_if_needed: simdjson copies the line into its own padded buffer
  // (reused between records), since a std::string has no padding.
  // An empty view may carry a null pointer, which simdjson would memcpy
  // from (undefined behaviour even for 0 bytes): give it a real one.
  const char* bytes = line.empty() ? "" : line.data();
  simdjson::error_code error =
      parser_->dom.parse(bytes, line.size(), /*realloc_if_needed=*/true)
          .get(doc);
  if (error) return absl::InvalidArgumentError(WhereInvalid(line, error));
  simdjson::dom::object object;
  if (doc.get(object)) {
    return absl::InvalidArgumentError("the record is not a JSON object");
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    simdjson::dom::element member;
    if (object.at_key(keys[k]).get(member)) continue;  // Absent.
    std::string_view text;
    if (member.get(text)) {
      return absl::InvalidArgumentError(
          absl::StrCat("value of key \"", keys[k], "\" is not a string"));
    }
    (*values)[k] = text;
  }
  return absl::OkStatus();
}

}  // namespace mcc::data
