// Fuzzes the schedule CSV reader (ReadScheduleCsv) and the checker that
// simulates what it read (CheckSchedule), as --pipeline-schedule-file feeds
// them. The first part is the shape, "ranks chunks microbatches" (small, so
// that the simulation stays quick; anything else falls back to 2 1 4); the
// second is the file. Any bytes give a status; a table that reads back is
// written again and reads back to the same rows.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/testing/fuzz/fuzz_input.h"
#include "glog/logging.h"
#include "parallel/pipeline/schedule_check.h"
#include "parallel/pipeline/schedule_csv.h"

namespace {

mcc::pipeline::ScheduleShape ShapeFrom(const std::string& text) {
  mcc::pipeline::ScheduleShape shape{2, 1, 4};
  std::vector<std::string> words = absl::StrSplit(text, ' ', absl::SkipEmpty());
  int v[3];
  if (words.size() != 3) return shape;
  for (int i = 0; i < 3; ++i) {
    if (!absl::SimpleAtoi(words[i], &v[i]) || v[i] < 1 || v[i] > 8) {
      return shape;
    }
  }
  return {v[0], v[1], v[2]};
}

bool SameRows(const mcc::pipeline::ScheduleTable& a,
              const mcc::pipeline::ScheduleTable& b) {
  if (a.rows.size() != b.rows.size()) return false;
  for (size_t i = 0; i < a.rows.size(); ++i) {
    const auto &x = a.rows[i], &y = b.rows[i];
    if (x.rank != y.rank || x.step != y.step || x.microbatch != y.microbatch ||
        x.chunk != y.chunk || x.op != y.op) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = mcc::fuzz::SplitParts(data, size, 2);
  const mcc::pipeline::ScheduleShape shape = ShapeFrom(parts[0]);
  auto table = mcc::pipeline::ReadScheduleCsv(parts[1], shape);
  if (!table.ok()) {
    CHECK(!table.status().message().empty());
    return 0;
  }
  mcc::pipeline::CheckSchedule(*table, 3).status().IgnoreError();
  const std::string again = mcc::pipeline::WriteScheduleCsv(*table);
  auto reread = mcc::pipeline::ReadScheduleCsv(again, shape);
  CHECK(reread.ok()) << reread.status() << "\n" << again;
  CHECK(SameRows(*table, *reread)) << again;
  return 0;
}
