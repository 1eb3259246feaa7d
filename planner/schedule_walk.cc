#include "planner/schedule_walk.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "parallel/pipeline/schedules.h"
#include "planner/stage_layers.h"

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

ChunkSeconds ChunkSecondsOf(const gpt::GPTConfig& model, const Layout& l,
                            const PipelineWork& work) {
  const int ranks = std::max(1, l.pp);
  const int chunks = std::max(1, l.virtual_stages);
  const pipeline::ScheduleShape shape{
      ranks, chunks, 1, l.schedule == PipelineSchedule::kZeroBubbleV};
  const int last = ranks * chunks - 1;
  ChunkSeconds out;
  out.total.assign(ranks, std::vector<double>(chunks, 0));
  out.weight.assign(ranks, std::vector<double>(chunks, 0));
  for (int r = 0; r < ranks; ++r) {
    const std::vector<pipeline::LayerRange> ranges =
        StageLayerRanges(model, l, r);
    for (int k = 0; k < chunks && k < static_cast<int>(ranges.size()); ++k) {
      const int v = VirtualStageOf(shape, r, k);
      double s = ranges[k].count * work.layer;
      double w = ranges[k].count * work.layer_weight;
      if (v == 0) s += work.embedding;
      if (v == last) {
        s += work.head;
        w += work.head_weight;
      }
      out.total[r][k] = s;
      out.weight[r][k] = w;
    }
  }
  return out;
}

absl::StatusOr<double> WalkStepSeconds(const pipeline::ScheduleTable& table,
                                       const ChunkSeconds& seconds) {
  const pipeline::ScheduleShape& s = table.shape;
  for (int r = 0; r < s.ranks; ++r) {
    if (r >= static_cast<int>(seconds.total.size()) ||
        r >= static_cast<int>(seconds.weight.size()) ||
        static_cast<int>(seconds.total[r].size()) < s.chunks ||
        static_cast<int>(seconds.weight[r].size()) < s.chunks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no time for rank ", r, "'s ", s.chunks, " chunk(s) of the table"));
    }
  }
  return SimulateStepSeconds(table, [&](const pipeline::ScheduleRow& row) {
    const double t = seconds.total[row.rank][row.chunk];
    const double w = seconds.weight[row.rank][row.chunk];
    switch (row.op) {
      case pipeline::ScheduleOp::kForward:
        return t / 3;
      case pipeline::ScheduleOp::kBackward:
        return 2 * t / 3 - w;
      case pipeline::ScheduleOp::kWeight:
        return w;
    }
    return 0.0;
  });
}

}  // namespace planner
}  // namespace mcc
