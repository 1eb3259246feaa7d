// Fuzzes the readers of JSON written by other runs or other projects with the
// same text: a flight-recorder dump (analyze_hang), a Chrome trace beside a
// good one (merge_traces) and a Hugging Face config.json (the planner).
// Whatever the text, each returns a status (never an exception: a value of
// the wrong type once threw nlohmann's type_error), and an error names the
// file it read.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "core/comm/hang_analysis.h"
#include "glog/logging.h"
#include "observability/trace_merge.h"
#include "planner/hf_config.h"

namespace {

void ExpectNamed(const absl::Status& s, absl::string_view file) {
  if (s.ok()) return;
  CHECK(absl::string_view(s.message()).find(file) != absl::string_view::npos)
      << "error names no file: " << s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ExpectNamed(mcc::comm::AnalyzeHang({{"flight_recorder_rank0.json", text}}, 2)
                  .status(),
              "flight_recorder_rank0.json");
  static const std::string* good = new std::string(
      R"({"traceEvents": [{"name": "fwd", "ph": "X", "ts": 5, "dur": 1,)"
      R"( "pid": 0, "tid": 0}], "mcc": {"rank": 0, "clock_sync_us": 3}})");
  ExpectNamed(mcc::observability::MergeChromeTraces(
                  {*good, text}, {"rank0.json", "rank1.json"})
                  .status(),
              "rank1.json");
  ExpectNamed(
      mcc::planner::GPTConfigFromHuggingFace(text, "config.json").status(),
      "config.json");
  return 0;
}
