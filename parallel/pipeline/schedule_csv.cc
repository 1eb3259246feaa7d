#include "parallel/pipeline/schedule_csv.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mcc {
namespace pipeline {
namespace {

constexpr absl::string_view kHeader = "rank,step,microbatch,chunk,op";

// Strict decimal: 1 to 9 ASCII digits, nothing else (no sign, no spaces).
bool ParseCount(absl::string_view field, int* out) {
  if (field.empty() || field.size() > 9) return false;
  int64_t value = 0;
  for (char c : field) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  *out = static_cast<int>(value);
  return true;
}

bool ParseOp(absl::string_view field, ScheduleOp* op) {
  if (field == "F") {
    *op = ScheduleOp::kForward;
  } else if (field == "B") {
    *op = ScheduleOp::kBackward;
  } else if (field == "W") {
    *op = ScheduleOp::kWeight;
  } else {
    return false;
  }
  return true;
}

// A field quoted for the message, bytes outside printable ASCII escaped.
std::string Quoted(absl::string_view field) {
  std::string s = "\"";
  for (unsigned char c : field.substr(0, 40)) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      s.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&s, "\\x", absl::Hex(c, absl::kZeroPad2));
    }
  }
  if (field.size() > 40) s += "...";
  return s + "\"";
}

}  // namespace

absl::StatusOr<ScheduleTable> ReadScheduleCsv(absl::string_view text,
                                              const ScheduleShape& shape) {
  if (absl::Status s = CheckScheduleShape(shape); !s.ok()) return s;
  ScheduleTable table;
  table.shape = shape;
  const size_t max_rows = static_cast<size_t>(shape.ranks) * shape.chunks *
                          static_cast<size_t>(shape.microbatches) * 3;
  int line_number = 0;
  bool header_seen = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    auto error = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline schedule CSV line ", line_number, ": ", what));
    };
    if (!header_seen) {
      if (line != kHeader) {
        return error(absl::StrCat("expected the header ", Quoted(kHeader),
                                  ", got ", Quoted(line)));
      }
      header_seen = true;
      continue;
    }
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    if (fields.size() != 5) {
      return error(absl::StrCat("expected 5 fields (", kHeader, "), got ",
                                fields.size(), " in ", Quoted(line)));
    }
    ScheduleRow row;
    row.line = line_number;
    const char* names[] = {"rank", "step", "microbatch", "chunk"};
    int* values[] = {&row.rank, &row.step, &row.microbatch, &row.chunk};
    for (int i = 0; i < 4; ++i) {
      if (!ParseCount(fields[i], values[i])) {
        return error(absl::StrCat(names[i], " ", Quoted(fields[i]),
                                  " is not a non-negative decimal integer"));
      }
    }
    if (!ParseOp(fields[4], &row.op)) {
      return error(
          absl::StrCat("op ", Quoted(fields[4]), " is not one of F, B, W"));
    }
    if (row.rank >= shape.ranks) {
      return error(absl::StrCat("rank ", row.rank, " is not below the ",
                                shape.ranks, " ranks"));
    }
    if (row.chunk >= shape.chunks) {
      return error(absl::StrCat("chunk ", row.chunk, " is not below the ",
                                shape.chunks, " chunks"));
    }
    if (row.microbatch >= shape.microbatches) {
      return error(absl::StrCat("micro-batch ", row.microbatch,
                                " is not below the ", shape.microbatches,
                                " micro-batches"));
    }
    if (table.rows.size() == max_rows) {
      return error(
          absl::StrCat("more rows than the ", max_rows, " the shape allows"));
    }
    table.rows.push_back(row);
  }
  if (!header_seen) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline schedule CSV: no header ", Quoted(kHeader)));
  }
  // Repeats, step gaps and missing rows, named by line.
  if (absl::Status s = CheckScheduleRows(table); !s.ok()) return s;
  return table;
}

std::string WriteScheduleCsv(const ScheduleTable& table) {
  std::string out = absl::StrCat(kHeader, "\n");
  for (const ScheduleRow& row : table.rows) {
    absl::StrAppend(&out, row.rank, ",", row.step, ",", row.microbatch, ",",
                    row.chunk, ",", std::string(1, ScheduleOpLetter(row.op)),
                    "\n");
  }
  return out;
}

}  // namespace pipeline
}  // namespace mcc
