#include "parallel/pipeline/schedule_table.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace pipeline {

char ScheduleOpLetter(ScheduleOp op) {
  switch (op) {
    case ScheduleOp::kForward:
      return 'F';
    case ScheduleOp::kBackward:
      return 'B';
    case ScheduleOp::kWeight:
      return 'W';
  }
  return '?';
}

std::string ScheduleRowString(const ScheduleRow& row) {
  std::string s =
      absl::StrCat("rank ", row.rank, " step ", row.step, ": ",
                   std::string(1, ScheduleOpLetter(row.op)), " micro-batch ",
                   row.microbatch, " chunk ", row.chunk);
  if (row.line > 0) absl::StrAppend(&s, " (line ", row.line, ")");
  return s;
}

absl::Status CheckScheduleShape(const ScheduleShape& shape) {
  const int64_t cells = static_cast<int64_t>(shape.ranks) * shape.chunks *
                        static_cast<int64_t>(shape.microbatches);
  if (shape.ranks < 1 || shape.chunks < 1 || shape.microbatches < 1 ||
      cells > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline schedule shape: ", shape.ranks, " ranks, ", shape.chunks,
        " chunks, ", shape.microbatches,
        " micro-batches (each must be positive, their product at most 2^20)"));
  }
  return absl::OkStatus();
}

absl::Status CheckScheduleRows(const ScheduleTable& table) {
  const ScheduleShape& shape = table.shape;
  if (absl::Status s = CheckScheduleShape(shape); !s.ok()) return s;
  const int ops = 3;
  // Row index per (rank, chunk, micro-batch, op); -1 when absent.
  std::vector<int> seen(static_cast<size_t>(shape.ranks) * shape.chunks *
                            shape.microbatches * ops,
                        -1);
  std::vector<std::vector<int>> steps(shape.ranks);  // Row index per step.
  const size_t max_steps = static_cast<size_t>(shape.chunks) *
                           static_cast<size_t>(shape.microbatches) * ops;
  bool has_weight = false;
  for (size_t i = 0; i < table.rows.size(); ++i) {
    const ScheduleRow& row = table.rows[i];
    if (row.rank < 0 || row.rank >= shape.ranks || row.chunk < 0 ||
        row.chunk >= shape.chunks || row.microbatch < 0 ||
        row.microbatch >= shape.microbatches || row.step < 0 ||
        static_cast<size_t>(row.step) >= max_steps ||
        (row.op != ScheduleOp::kForward && row.op != ScheduleOp::kBackward &&
         row.op != ScheduleOp::kWeight)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline schedule: ", ScheduleRowString(row), " is out of range (",
          shape.ranks, " ranks, ", shape.chunks, " chunks, ",
          shape.microbatches, " micro-batches, steps below ", max_steps, ")"));
    }
    has_weight |= row.op == ScheduleOp::kWeight;
    const size_t key =
        ((static_cast<size_t>(row.rank) * shape.chunks + row.chunk) *
             shape.microbatches +
         row.microbatch) *
            ops +
        static_cast<int>(row.op);
    if (seen[key] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline schedule: ", ScheduleRowString(row),
                       " repeats ", ScheduleRowString(table.rows[seen[key]])));
    }
    seen[key] = static_cast<int>(i);
    std::vector<int>& by_step = steps[row.rank];
    if (by_step.size() <= static_cast<size_t>(row.step)) {
      by_step.resize(row.step + 1, -1);
    }
    if (by_step[row.step] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline schedule: ", ScheduleRowString(row), " takes the step of ",
          ScheduleRowString(table.rows[by_step[row.step]])));
    }
    by_step[row.step] = static_cast<int>(i);
  }
  for (int r = 0; r < shape.ranks; ++r) {
    for (int c = 0; c < shape.chunks; ++c) {
      for (int m = 0; m < shape.microbatches; ++m) {
        for (ScheduleOp op : {ScheduleOp::kForward, ScheduleOp::kBackward,
                              ScheduleOp::kWeight}) {
          if (op == ScheduleOp::kWeight && !has_weight) continue;
          const size_t key = ((static_cast<size_t>(r) * shape.chunks + c) *
                                  shape.microbatches +
                              m) *
                                 ops +
                             static_cast<int>(op);
          if (seen[key] < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "pipeline schedule: missing row: rank ", r, " ",
                std::string(1, ScheduleOpLetter(op)), " micro-batch ", m,
                " chunk ", c,
                op == ScheduleOp::kWeight ? " (other rows split off W)" : ""));
          }
        }
      }
    }
  }
  for (int r = 0; r < shape.ranks; ++r) {
    for (size_t s = 0; s < steps[r].size(); ++s) {
      if (steps[r][s] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("pipeline schedule: rank ", r, " has no step ", s,
                         " but has step ", steps[r].size() - 1));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ScheduleTable> GenerateScheduleTable(
    ScheduleKind kind, const ScheduleShape& shape) {
  if (absl::Status s = CheckScheduleShape(shape); !s.ok()) return s;
  ScheduleTable table;
  table.shape = shape;
  table.shape.v_shape = IsVShaped(kind);
  for (int r = 0; r < shape.ranks; ++r) {
    absl::StatusOr<std::vector<Action>> actions =
        BuildSchedule(kind, shape.ranks, r, shape.chunks, shape.microbatches);
    if (!actions.ok()) return actions.status();
    for (size_t i = 0; i < actions->size(); ++i) {
      const Action& a = (*actions)[i];
      ScheduleRow row;
      row.rank = r;
      row.step = static_cast<int>(i);
      row.microbatch = a.microbatch;
      row.chunk = a.chunk;
      row.op = a.kind == Action::kForward    ? ScheduleOp::kForward
               : a.kind == Action::kBackward ? ScheduleOp::kBackward
                                             : ScheduleOp::kWeight;
      table.rows.push_back(row);
    }
  }
  return table;
}

}  // namespace pipeline
}  // namespace mcc
