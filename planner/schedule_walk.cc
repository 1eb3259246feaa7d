#include "planner/schedule_walk.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "parallel/pipeline/schedules.h"

namespace mcc {
namespace planner {

namespace {

// The builder's kind for a generated schedule (not kFile on PP > 1).
pipeline::ScheduleKind KindOf(const Layout& l) {
  if (l.pp == 1) return pipeline::ScheduleKind::kNoPipelining;
  if (l.schedule == PipelineSchedule::kZeroBubbleH1) {
    return pipeline::ScheduleKind::kZeroBubbleH1;
  }
  if (l.schedule == PipelineSchedule::kZeroBubbleV) {
    return pipeline::ScheduleKind::kZeroBubbleV;
  }
  return l.virtual_stages > 1 ? pipeline::ScheduleKind::kInterleaved
                              : pipeline::ScheduleKind::kOneFOneB;
}

bool FromFile(const Layout& l) {
  return l.pp > 1 && l.schedule == PipelineSchedule::kFile;
}

}  // namespace

absl::StatusOr<std::vector<pipeline::ScheduleRow>> LayoutRankRows(
    const JobSpec& job, const Layout& l, int microbatches, int rank) {
  if (FromFile(l)) {
    auto table = LayoutScheduleTable(job, l, microbatches);
    if (!table.ok()) return table.status();
    return RowsOfRank(*table, rank);
  }
  auto actions = pipeline::BuildSchedule(
      KindOf(l), l.pp, rank, l.virtual_stages, std::max(1, microbatches));
  if (!actions.ok()) return actions.status();
  std::vector<pipeline::ScheduleRow> rows;
  rows.reserve(actions->size());
  for (const pipeline::Action& a : *actions) {
    pipeline::ScheduleRow row;
    row.rank = rank;
    row.step = static_cast<int>(rows.size());
    row.microbatch = a.microbatch;
    row.chunk = a.chunk;
    row.op = a.kind == pipeline::Action::kForward
                 ? pipeline::ScheduleOp::kForward
             : a.kind == pipeline::Action::kBackward
                 ? pipeline::ScheduleOp::kBackward
                 : pipeline::ScheduleOp::kWeight;
    rows.push_back(row);
  }
  return rows;
}

bool LayoutSplitsBackward(const JobSpec& job, const Layout& l) {
  if (FromFile(l)) {
    return job.schedule_table != nullptr && SplitsBackward(*job.schedule_table);
  }
  return KindOf(l) == pipeline::ScheduleKind::kZeroBubbleH1 ||
         KindOf(l) == pipeline::ScheduleKind::kZeroBubbleV;
}

absl::StatusOr<pipeline::ScheduleTable> LayoutScheduleTable(const JobSpec& job,
                                                            const Layout& l,
                                                            int microbatches) {
  pipeline::ScheduleShape shape{l.pp, l.virtual_stages,
                                std::max(1, microbatches)};
  shape.v_shape = l.schedule == PipelineSchedule::kZeroBubbleV;
  if (FromFile(l)) {
    if (job.schedule_table == nullptr) {
      return absl::InvalidArgumentError(
          "the file schedule needs --pipeline-schedule-file's table");
    }
    const pipeline::ScheduleShape& s = job.schedule_table->shape;
    if (s.ranks != shape.ranks || s.chunks != shape.chunks ||
        s.microbatches != shape.microbatches) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the schedule file is for ", s.ranks, " stages x ", s.chunks,
          " chunks x ", s.microbatches, " micro-batches, not ", shape.ranks,
          " x ", shape.chunks, " x ", shape.microbatches));
    }
    return *job.schedule_table;
  }
  return pipeline::GenerateScheduleTable(KindOf(l), shape);
}

std::vector<pipeline::ScheduleRow> RowsOfRank(
    const pipeline::ScheduleTable& table, int rank) {
  std::vector<pipeline::ScheduleRow> rows;
  for (const pipeline::ScheduleRow& r : table.rows) {
    if (r.rank == rank) rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end(),
            [](const pipeline::ScheduleRow& a, const pipeline::ScheduleRow& b) {
              return a.step < b.step;
            });
  return rows;
}

bool SplitsBackward(const pipeline::ScheduleTable& table) {
  return std::any_of(table.rows.begin(), table.rows.end(),
                     [](const pipeline::ScheduleRow& r) {
                       return r.op == pipeline::ScheduleOp::kWeight;
                     });
}

int VirtualStageOf(const pipeline::ScheduleShape& shape, int rank, int chunk) {
  return pipeline::VirtualStage(shape.ranks, rank, chunk, shape.v_shape);
}

absl::StatusOr<double> SimulateStepSeconds(
    const pipeline::ScheduleTable& table,
    const std::function<double(const pipeline::ScheduleRow&)>& seconds) {
  const pipeline::ScheduleShape& s = table.shape;
  const int stages = s.ranks * s.chunks;
  // finish[(stage x m + micro-batch) x 3 + op], < 0 until it ran.
  std::vector<double> finish(static_cast<size_t>(stages) * s.microbatches * 3,
                             -1);
  auto at = [&](int stage, int mb, pipeline::ScheduleOp op) -> double& {
    return finish[(static_cast<size_t>(stage) * s.microbatches + mb) * 3 +
                  static_cast<int>(op)];
  };
  std::vector<std::vector<pipeline::ScheduleRow>> rows(s.ranks);
  for (int r = 0; r < s.ranks; ++r) rows[r] = RowsOfRank(table, r);
  std::vector<size_t> next(s.ranks, 0);
  std::vector<double> free(s.ranks, 0);
  double end = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.ranks; ++r) {
      while (next[r] < rows[r].size()) {
        const pipeline::ScheduleRow& row = rows[r][next[r]];
        const int v = VirtualStageOf(s, r, row.chunk);
        double ready = free[r];
        auto need = [&](int stage, pipeline::ScheduleOp op) {
          const double f = at(stage, row.microbatch, op);
          ready = std::max(ready, f);
          return f >= 0;
        };
        bool ok = true;
        switch (row.op) {
          case pipeline::ScheduleOp::kForward:
            if (v > 0) ok = need(v - 1, pipeline::ScheduleOp::kForward);
            break;
          case pipeline::ScheduleOp::kBackward:
            ok = need(v, pipeline::ScheduleOp::kForward);
            if (ok && v < stages - 1) {
              ok = need(v + 1, pipeline::ScheduleOp::kBackward);
            }
            break;
          case pipeline::ScheduleOp::kWeight:
            ok = need(v, pipeline::ScheduleOp::kBackward);
            break;
        }
        if (!ok) break;
        free[r] = ready + std::max(0.0, seconds(row));
        at(v, row.microbatch, row.op) = free[r];
        end = std::max(end, free[r]);
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.ranks; ++r) {
    if (next[r] < rows[r].size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the schedule stalls at ",
                       pipeline::ScheduleRowString(rows[r][next[r]])));
    }
  }
  return end;
}

}  // namespace planner
}  // namespace mcc
