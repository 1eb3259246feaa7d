#include "observability/trace_merge.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/json_document.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace observability {
namespace {

// What the merge reads of one trace event.
struct Event {
  bool complete = false;  // "ph": "X"
  bool has_ts = false;
  int64_t ts = 0;
};

}  // namespace

absl::StatusOr<std::string> MergeChromeTraces(
    const std::vector<std::string>& traces,
    const std::vector<std::string>& names) {
  if (traces.empty()) {
    return absl::InvalidArgumentError("no traces to merge");
  }
  std::vector<nlohmann::json> docs;
  std::vector<int64_t> sync;
  std::vector<std::vector<Event>> all_events;  // Per doc, read by type.
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
    // Members are read by type: a wrong-typed one is an error naming the
    // file and field (nlohmann's value() would throw type_error).
    int64_t mark = -1;
    if (doc.contains("mcc")) {
      absl::StatusOr<int64_t> m =
          JsonIntMember(doc["mcc"], "clock_sync_us", -1, name + ": mcc");
      if (!m.ok()) return m.status();
      mark = *m;
    }
    if (mark < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name,
          ": no clock-sync mark (mcc.clock_sync_us); the rank did not "
          "pass the start barrier"));
    }
    std::vector<Event> events;
    const nlohmann::json& trace_events = doc["traceEvents"];
    for (size_t k = 0; k < trace_events.size(); ++k) {
      const std::string where = absl::StrCat(name, ": traceEvents[", k, "]");
      Event e;
      absl::StatusOr<std::string> ph =
          JsonStringMember(trace_events[k], "ph", "", where);
      if (!ph.ok()) return ph.status();
      e.complete = *ph == "X";
      e.has_ts = trace_events[k].contains("ts");
      absl::StatusOr<int64_t> ts =
          JsonIntMember(trace_events[k], "ts", 0, where);
      if (!ts.ok()) return ts.status();
      e.ts = *ts;
      events.push_back(e);
    }
    sync.push_back(mark);
    docs.push_back(std::move(doc));
    all_events.push_back(std::move(events));
  }
  // Shift every rank onto the first rank's clock, then start at zero. The
  // sums are checked: times come from files.
  auto out_of_range = [&](size_t i) {
    return absl::InvalidArgumentError(
        absl::StrCat(i < names.size() ? names[i] : absl::StrCat(i),
                     ": a \"ts\" or the clock-sync mark is out of range"));
  };
  int64_t first = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < docs.size(); ++i) {
    const int64_t shift = sync[0] - sync[i];  // Both non-negative.
    for (const Event& e : all_events[i]) {
      int64_t t;
      if (__builtin_add_overflow(e.ts, shift, &t)) return out_of_range(i);
      if (e.complete) first = std::min(first, t);
    }
  }
  if (first == std::numeric_limits<int64_t>::max()) first = sync[0];
  nlohmann::json merged = nlohmann::json::array();
  for (size_t i = 0; i < docs.size(); ++i) {
    int64_t shift;
    if (__builtin_sub_overflow(sync[0] - sync[i], first, &shift)) {
      return out_of_range(i);
    }
    const nlohmann::json& trace_events = docs[i]["traceEvents"];
    for (size_t k = 0; k < trace_events.size(); ++k) {
      nlohmann::json e = trace_events[k];
      if (all_events[i][k].has_ts) {
        int64_t t;
        if (__builtin_add_overflow(all_events[i][k].ts, shift, &t)) {
          return out_of_range(i);
        }
        e["ts"] = t;
      }
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
