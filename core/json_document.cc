#include "core/json_document.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace mcc {
namespace {

// Thrown from the parser callback to stop parsing at the first duplicate key
// or too-deep value; nlohmann passes it through untouched.
struct Rejected {
  std::string why;
};

}  // namespace

std::string JsonErrorMessage(const nlohmann::json::exception& e) {
  absl::string_view what = e.what();
  // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
  const size_t tag_end = what.find("] ");
  if (tag_end != absl::string_view::npos) what.remove_prefix(tag_end + 2);
  for (absl::string_view lead : {"parse error at ", "parse error: "}) {
    if (what.substr(0, lead.size()) == lead) what.remove_prefix(lead.size());
  }
  return std::string(what);
}

absl::StatusOr<JsonDocument> ParseJsonDocument(absl::string_view text) {
  // One key set per object being parsed, innermost last.
  std::vector<absl::flat_hash_set<std::string>> keys;
  int depth = 0;
  auto check = [&](int /*depth*/, nlohmann::json::parse_event_t event,
                   JsonDocument& parsed) {
    using Event = nlohmann::json::parse_event_t;
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (++depth > kMaxJsonDepth) {
          throw Rejected{absl::StrCat("nesting deeper than ", kMaxJsonDepth)};
        }
        if (event == Event::object_start) keys.emplace_back();
        break;
      case Event::object_end:
        keys.pop_back();
        --depth;
        break;
      case Event::array_end:
        --depth;
        break;
      case Event::key:
        if (!keys.back().insert(parsed.get_ref<const std::string&>()).second) {
          throw Rejected{absl::StrCat(
              "duplicate key \"", parsed.get_ref<const std::string&>(), "\"")};
        }
        break;
      case Event::value:
        break;
    }
    return true;
  };
  try {
    return JsonDocument::parse(text.begin(), text.end(), check);
  } catch (const Rejected& r) {
    return absl::InvalidArgumentError(r.why);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(JsonErrorMessage(e));
  }
}

}  // namespace mcc
