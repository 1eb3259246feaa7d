#include "observability/trace_merge.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace observability {

absl::StatusOr<std::string> MergeChromeTraces(
    const std::vector<std::string>& traces,
    const std::vector<std::string>& names) {
  if (traces.empty()) {
    return absl::InvalidArgumentError("no traces to merge");
  }
  std::vector<nlohmann::json> docs;
  std::vector<int64_t> sync;
  for (size_t i = 0; i < traces.size(); ++i) {
    const std::string& name = i < names.size() ? names[i] : absl::StrCat(i);
    nlohmann::json doc =
        nlohmann::json::parse(traces[i], nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object() ||
        !doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name,
                       ": not a Chrome trace (JSON object with a "
                       "traceEvents array)"));
    }
    const nlohmann::json& meta = doc.value("mcc", nlohmann::json::object());
    const int64_t mark = meta.value("clock_sync_us", int64_t{-1});
    if (mark < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name,
          ": no clock-sync mark (mcc.clock_sync_us); the rank did not "
          "pass the start barrier"));
    }
    sync.push_back(mark);
    docs.push_back(std::move(doc));
  }
  // Shift every rank onto the first rank's clock, then start at zero.
  int64_t first = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < docs.size(); ++i) {
    const int64_t shift = sync[0] - sync[i];
    for (const nlohmann::json& e : docs[i]["traceEvents"]) {
      if (e.value("ph", "") == "X") {
        first = std::min(first, e.value("ts", int64_t{0}) + shift);
      }
    }
  }
  if (first == std::numeric_limits<int64_t>::max()) first = sync[0];
  nlohmann::json merged = nlohmann::json::array();
  for (size_t i = 0; i < docs.size(); ++i) {
    const int64_t shift = sync[0] - sync[i] - first;
    for (nlohmann::json e : docs[i]["traceEvents"]) {
      if (e.contains("ts")) e["ts"] = e.value("ts", int64_t{0}) + shift;
      merged.push_back(std::move(e));
    }
  }
  nlohmann::json out = {{"traceEvents", merged},
                        {"displayTimeUnit", "ms"},
                        {"mcc", {{"ranks", docs.size()}}}};
  return out.dump();
}

}  // namespace observability
}  // namespace mcc
