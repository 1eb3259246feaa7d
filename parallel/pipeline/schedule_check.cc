#include "parallel/pipeline/schedule_check.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace pipeline {
namespace {

// One operation's place: which virtual stage's (micro-batch, op).
struct Need {
  int rank;
  int chunk;
  int microbatch;
  ScheduleOp op;
};

class Simulator {
 public:
  explicit Simulator(const ScheduleTable& table)
      : table_(table),
        shape_(table.shape),
        done_(Cells(), false),
        where_(Cells(), -1),
        order_(shape_.ranks) {
    for (size_t i = 0; i < table.rows.size(); ++i) {
      const ScheduleRow& row = table.rows[i];
      where_[Key(row.rank, row.chunk, row.microbatch, row.op)] =
          static_cast<int>(i);
      has_weight_ |= row.op == ScheduleOp::kWeight;
      order_[row.rank].push_back(static_cast<int>(i));
    }
    for (std::vector<int>& rows : order_) {
      std::sort(rows.begin(), rows.end(), [&](int a, int b) {
        return table_.rows[a].step < table_.rows[b].step;
      });
    }
  }

  absl::StatusOr<ScheduleCheck> Run(int max_held) {
    ScheduleCheck check;
    check.peak_held.assign(shape_.ranks, 0);
    std::vector<int> held(shape_.ranks, 0);
    std::vector<size_t> next(shape_.ranks, 0);
    size_t remaining = table_.rows.size();
    std::vector<size_t> finished;  // Keys finished this round.
    while (remaining > 0) {
      finished.clear();
      const ScheduleRow* stalled = nullptr;  // Lowest stalled rank's row.
      for (int r = 0; r < shape_.ranks; ++r) {
        if (next[r] == order_[r].size()) continue;
        const ScheduleRow& row = table_.rows[order_[r][next[r]]];
        std::vector<Need> needs = Needs(row);
        bool ready = true;
        for (const Need& n : needs) {
          ready &= done_[Key(n.rank, n.chunk, n.microbatch, n.op)];
        }
        if (!ready) {
          if (stalled == nullptr) stalled = &row;
          continue;
        }
        finished.push_back(Key(row.rank, row.chunk, row.microbatch, row.op));
        ++next[r];
        --remaining;
        const ScheduleOp frees =
            has_weight_ ? ScheduleOp::kWeight : ScheduleOp::kBackward;
        if (row.op == ScheduleOp::kForward) {
          check.peak_held[r] = std::max(check.peak_held[r], ++held[r]);
          if (max_held > 0 && held[r] > max_held) {
            return absl::ResourceExhaustedError(absl::StrCat(
                "pipeline schedule: after ", ScheduleRowString(row), " rank ",
                r, " holds ", held[r],
                " micro-batches' activations, over the bound of ", max_held));
          }
        } else if (row.op == frees) {
          --held[r];
        }
      }
      if (finished.empty()) return Stall(*stalled);
      for (size_t key : finished) done_[key] = true;
      ++check.rounds;
    }
    return check;
  }

 private:
  size_t Cells() const {
    return static_cast<size_t>(shape_.ranks) * shape_.chunks *
           shape_.microbatches * 3;
  }
  size_t Key(int rank, int chunk, int microbatch, ScheduleOp op) const {
    return ((static_cast<size_t>(rank) * shape_.chunks + chunk) *
                shape_.microbatches +
            microbatch) *
               3 +
           static_cast<int>(op);
  }

  std::vector<Need> Needs(const ScheduleRow& row) const {
    const int stage =
        VirtualStage(shape_.ranks, row.rank, row.chunk, shape_.v_shape);
    const int last = shape_.chunks * shape_.ranks - 1;
    auto at = [&](int v, ScheduleOp op) {
      Need need{0, 0, row.microbatch, op};
      StageAndChunkOf(shape_.ranks, v, shape_.v_shape, &need.rank, &need.chunk);
      return need;
    };
    switch (row.op) {
      case ScheduleOp::kForward:
        if (stage > 0) return {at(stage - 1, ScheduleOp::kForward)};
        return {};
      case ScheduleOp::kBackward:
        if (stage < last) {
          return {at(stage, ScheduleOp::kForward),
                  at(stage + 1, ScheduleOp::kBackward)};
        }
        return {at(stage, ScheduleOp::kForward)};
      case ScheduleOp::kWeight:
        return {at(stage, ScheduleOp::kBackward)};
    }
    return {};
  }

  absl::Status Stall(const ScheduleRow& stuck) const {
    for (const Need& n : Needs(stuck)) {
      if (done_[Key(n.rank, n.chunk, n.microbatch, n.op)]) continue;
      const ScheduleRow& other =
          table_.rows[where_[Key(n.rank, n.chunk, n.microbatch, n.op)]];
      return absl::FailedPreconditionError(absl::StrCat(
          "pipeline schedule deadlocks: ", ScheduleRowString(stuck),
          " waits for ", ScheduleRowString(other), ", which cannot run first"));
    }
    return absl::InternalError("pipeline schedule: stalled with nothing due");
  }

  const ScheduleTable& table_;
  const ScheduleShape& shape_;
  std::vector<bool> done_;
  std::vector<int> where_;               // Row index per key.
  std::vector<std::vector<int>> order_;  // Row indices per rank, by step.
  bool has_weight_ = false;
};

}  // namespace

absl::StatusOr<ScheduleCheck> CheckSchedule(const ScheduleTable& table,
                                            int max_held) {
  if (absl::Status s = CheckScheduleRows(table); !s.ok()) return s;
  return Simulator(table).Run(max_held);
}

}  // namespace pipeline
}  // namespace mcc
