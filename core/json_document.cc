#include "core/json_document.h"

#include <cstdint>
#include <limits>
#include <optional>
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

namespace {

// The member, or nullptr when absent; an error when `object` is no object.
absl::StatusOr<const JsonDocument*> Member(const JsonDocument& object,
                                           absl::string_view key,
                                           absl::string_view where) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected a JSON object, found ", object.type_name()));
  }
  auto it = object.find(std::string(key));
  if (it == object.end()) return nullptr;
  return &*it;
}

absl::Status WrongType(absl::string_view where, absl::string_view key,
                       absl::string_view want, const JsonDocument& got) {
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": \"", key, "\" must be ", want, ", found ", got.type_name()));
}

// An integer JSON value as int64, or nullopt (not an integer, or too big).
std::optional<int64_t> AsInt64(const JsonDocument& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

}  // namespace

absl::StatusOr<int64_t> JsonIntMember(const JsonDocument& object,
                                      absl::string_view key, int64_t fallback,
                                      absl::string_view where) {
  absl::StatusOr<const JsonDocument*> v = Member(object, key, where);
  if (!v.ok()) return v.status();
  if (*v == nullptr) return fallback;
  const std::optional<int64_t> i = AsInt64(**v);
  if (!i.has_value()) {
    return WrongType(where, key, "an integer within int64", **v);
  }
  return *i;
}

absl::StatusOr<std::string> JsonStringMember(const JsonDocument& object,
                                             absl::string_view key,
                                             absl::string_view fallback,
                                             absl::string_view where) {
  absl::StatusOr<const JsonDocument*> v = Member(object, key, where);
  if (!v.ok()) return v.status();
  if (*v == nullptr) return std::string(fallback);
  if (!(*v)->is_string()) return WrongType(where, key, "a string", **v);
  return (*v)->get<std::string>();
}

absl::StatusOr<bool> JsonBoolMember(const JsonDocument& object,
                                    absl::string_view key, bool fallback,
                                    absl::string_view where) {
  absl::StatusOr<const JsonDocument*> v = Member(object, key, where);
  if (!v.ok()) return v.status();
  if (*v == nullptr) return fallback;
  if (!(*v)->is_boolean()) return WrongType(where, key, "true or false", **v);
  return (*v)->get<bool>();
}

absl::StatusOr<std::vector<int64_t>> JsonIntArrayMember(
    const JsonDocument& object, absl::string_view key,
    absl::string_view where) {
  absl::StatusOr<const JsonDocument*> v = Member(object, key, where);
  if (!v.ok()) return v.status();
  std::vector<int64_t> out;
  if (*v == nullptr || (*v)->is_null()) return out;
  if (!(*v)->is_array()) {
    return WrongType(where, key, "an array of integers", **v);
  }
  for (const JsonDocument& e : **v) {
    const std::optional<int64_t> i = AsInt64(e);
    if (!i.has_value()) {
      return WrongType(where, key, "an array of integers", **v);
    }
    out.push_back(*i);
  }
  return out;
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
