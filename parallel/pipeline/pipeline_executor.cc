#include "parallel/pipeline/pipeline_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <list>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/ops/loss_totals.h"
#include "core/status_macros.h"
#include "observability/trace.h"
#include "parallel/pipeline/schedule_check.h"

namespace mcc {
namespace pipeline {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

// train --profile's timeline: one event from `since` until now on the main
// track. Off, it costs one relaxed load (describe fills in the rest; a
// template, so that nothing is built when off).
template <typename Describe>
void Trace(std::chrono::steady_clock::time_point since, Describe describe) {
  observability::TraceRecorder& trace = observability::TraceRecorder::Global();
  if (!trace.enabled()) return;
  observability::TraceEvent e;
  e.start_us = observability::TraceRecorder::ToMicros(since);
  e.duration_us = observability::TraceRecorder::NowMicros() - e.start_us;
  describe(&e);
  trace.Record(std::move(e));
}

// A forward or backward: "forward mb 3" ("... chunk 1" with virtual
// stages), with the micro-batch, chunk, stage and virtual stage (Megatron's
// model chunk index, chunk x stages + stage) as arguments.
void TraceAction(const Action& a, const StageLayout& layout, bool forward_only,
                 std::chrono::steady_clock::time_point since) {
  Trace(since, [&](observability::TraceEvent* e) {
    e->name = absl::StrCat(a.kind == Action::kForward    ? "forward"
                           : a.kind == Action::kBackward ? "backward"
                                                         : "weight",
                           " mb ", a.microbatch);
    if (layout.chunks > 1) absl::StrAppend(&e->name, " chunk ", a.chunk);
    e->category = forward_only ? "eval" : "compute";
    e->args = {
        {"microbatch", absl::StrCat(a.microbatch)},
        {"chunk", absl::StrCat(a.chunk)},
        {"stage", absl::StrCat(layout.stage)},
        {"virtual_stage", absl::StrCat(VirtualStage(layout.stages, layout.stage,
                                                    a.chunk, layout.v_shape))}};
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(
    std::vector<parallel::PipelineStage*> chunks, comm::ProcessGroup* pipeline,
    PipelineOptions options) {
  if (chunks.empty()) {
    return absl::InvalidArgumentError("pipeline: no model chunks");
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline: model chunk ", i, " is null"));
    }
  }
  auto e = std::unique_ptr<PipelineExecutor>(new PipelineExecutor);
  e->chunks_ = std::move(chunks);
  e->pipeline_ = pipeline;
  e->options_ = options;
  e->stages_ = pipeline != nullptr ? pipeline->size() : 1;
  e->stage_ = pipeline != nullptr ? pipeline->rank() : 0;
  if (e->stages_ > 1) e->p2p_ = std::make_unique<PipelineP2P>(pipeline);
  const int v = static_cast<int>(e->chunks_.size());
  if (v > 1 && e->stages_ == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: ", v,
                     " model chunks (virtual stages) need a pipeline "
                     "group of at least 2 stages"));
  }
  const bool v_shape = IsVShaped(options.schedule);
  if (v_shape && (v != 2 || e->stages_ < 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: ", ScheduleName(options.schedule),
        " runs two model chunks per stage on at least 2 stages, not ", v,
        " on ", e->stages_));
  }
  if (v_shape && pipeline != nullptr && !pipeline->device().is_cpu()) {
    // The transfer plan is safe with NCCL's blocking sends (p2p.h; p2p_test
    // simulates it, and pipeline_parity_test runs it through the NCCL-like
    // wrapper), but it has not been run on a GPU yet.
    return absl::UnimplementedError(
        "pipeline: ZB-V runs over the CPU (gloo) pipeline group only: its "
        "transfers have not been run over NCCL on a device yet");
  }
  const StageLayout layout{e->stages_, e->stage_, v, v_shape};
  int loss_chunk = 0;
  StageAndChunkOf(e->stages_, e->stages_ * v - 1, v_shape, &e->loss_stage_,
                  &loss_chunk);
  for (int c = 0; c < v; ++c) {
    if (layout.TakesBatchInput(c) && !e->chunks_[c]->takes_batch_input()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline: chunk ", c, " of stage ", e->stage_,
                       " is the first virtual stage and must take the batch "
                       "input (hold the embeddings)"));
    }
    if (layout.ComputesLoss(c) && !e->chunks_[c]->computes_loss()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline: chunk ", c, " of stage ", e->stage_,
          " is the last virtual stage and must compute the loss (hold the "
          "output layer)"));
    }
  }
  if (options.schedule == ScheduleKind::kNoPipelining && e->stages_ > 1) {
    options.schedule = ScheduleKind::kOneFOneB;
    e->options_ = options;
  }
  return e;
}

absl::Status PipelineExecutor::BroadcastLossTotals(Tensor* totals) {
  if (stages_ == 1) return absl::OkStatus();
  // The totals' fp32 parts travel bit for bit; only the loss stage's (the
  // last, or stage 0 in a V) are defined here.
  const Device device = pipeline_->device();
  if (!totals->defined()) {
    *totals = Tensor::Empty({ops::kLossTotalsSize}, DType::kFloat32, device);
  } else if (totals->device() != device) {
    MCC_ASSIGN_OR_RETURN(*totals, totals->To(device));
  }
  return pipeline_->BroadcastSync(totals, loss_stage_);
}

absl::StatusOr<std::vector<Action>> PipelineExecutor::TrainingActions(
    ScheduleKind kind, int m) {
  auto found = checked_actions_.find(m);
  if (found != checked_actions_.end()) return found->second;
  const int v = static_cast<int>(chunks_.size());
  const bool v_shape = IsVShaped(options_.schedule);
  const ScheduleShape shape{stages_, v, m, v_shape};
  ScheduleTable generated;
  const ScheduleTable* table = options_.table.get();
  int max_held = 0;
  if (table != nullptr) {
    const ScheduleShape& s = table->shape;
    if (s.ranks != shape.ranks || s.chunks != shape.chunks ||
        s.microbatches != shape.microbatches || s.v_shape != shape.v_shape) {
      auto placement = [](bool v) { return v ? " (V-shaped)" : ""; };
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline schedule table is for ", s.ranks, " ranks, ", s.chunks,
          " chunks", placement(s.v_shape), " and ", s.microbatches,
          " micro-batches, but this step has ", shape.ranks, " ranks, ",
          shape.chunks, " chunks", placement(shape.v_shape), " and ",
          shape.microbatches, " micro-batches"));
    }
    max_held = options_.table_max_held;
  }
  if (table != nullptr && max_held == 0) {
    // By default a table may hold no more than the built-in schedule's
    // busiest rank.
    MCC_ASSIGN_OR_RETURN(
        ScheduleTable reference,
        GenerateScheduleTable(v_shape ? ScheduleKind::kZeroBubbleV
                              : v > 1 ? ScheduleKind::kInterleaved
                                      : ScheduleKind::kOneFOneB,
                              shape));
    MCC_ASSIGN_OR_RETURN(ScheduleCheck check, CheckSchedule(reference));
    for (int peak : check.peak_held) max_held = std::max(max_held, peak);
  }
  if (table == nullptr) {
    MCC_ASSIGN_OR_RETURN(generated, GenerateScheduleTable(kind, shape));
    table = &generated;
  }
  MCC_RETURN_IF_ERROR(CheckSchedule(*table, max_held).status());
  std::vector<ScheduleRow> rows;
  bool split = false;
  std::vector<std::vector<const ScheduleRow*>> by_rank(stages_);
  for (const ScheduleRow& row : table->rows) {
    split |= row.op == ScheduleOp::kWeight;
    if (row.rank == stage_) rows.push_back(row);
    by_rank[row.rank].push_back(&row);
  }
  if (v_shape) {
    // Every stage's order: the V's transfers are planned from the peers'.
    std::vector<std::vector<Action>>& all = stage_actions_[m];
    all.assign(stages_, {});
    for (int r = 0; r < stages_; ++r) {
      std::sort(by_rank[r].begin(), by_rank[r].end(),
                [](const ScheduleRow* a, const ScheduleRow* b) {
                  return a->step < b->step;
                });
      for (const ScheduleRow* row : by_rank[r]) {
        all[r].push_back({row->op == ScheduleOp::kForward    ? Action::kForward
                          : row->op == ScheduleOp::kBackward ? Action::kBackward
                                                             : Action::kWeight,
                          row->microbatch, row->chunk});
      }
    }
  }
  std::sort(rows.begin(), rows.end(),
            [](const ScheduleRow& a, const ScheduleRow& b) {
              return a.step < b.step;
            });
  // Data parallelism reduces a chunk's gradients with its last micro-batch,
  // so nothing may add to them after.
  const ScheduleOp last_op =
      split ? ScheduleOp::kWeight : ScheduleOp::kBackward;
  std::vector<const ScheduleRow*> last(v, nullptr);
  std::vector<Action> actions;
  for (const ScheduleRow& row : rows) {
    if (row.op == last_op) last[row.chunk] = &row;
    actions.push_back({row.op == ScheduleOp::kForward    ? Action::kForward
                       : row.op == ScheduleOp::kBackward ? Action::kBackward
                                                         : Action::kWeight,
                       row.microbatch, row.chunk});
  }
  for (const ScheduleRow* row : last) {
    if (row != nullptr && row->microbatch != m - 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline schedule: ", ScheduleRowString(*row),
          " is the chunk's last gradient step, but micro-batch ", m - 1,
          "'s must be (data parallelism reduces the gradients after it)"));
    }
  }
  checked_actions_[m] = actions;
  return actions;
}

absl::StatusOr<PipelineStepResult> PipelineExecutor::Run(int num_microbatches,
                                                         float grad_scale,
                                                         bool forward_only) {
  const auto start = std::chrono::steady_clock::now();
  if (num_microbatches < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: ", num_microbatches, " micro-batches asked for"));
  }
  const int m = num_microbatches;
  const int v = static_cast<int>(chunks_.size());
  ScheduleKind kind = options_.schedule;
  // ZB-H1 with several chunks is refused by BuildSchedule, naming it.
  if (v > 1 && kind != ScheduleKind::kZeroBubbleH1 &&
      kind != ScheduleKind::kZeroBubbleV) {
    kind = ScheduleKind::kInterleaved;
  }
  std::vector<Action> actions;
  if (forward_only || m == 0) {
    MCC_ASSIGN_OR_RETURN(
        actions, BuildSchedule(kind, stages_, stage_, v, m, forward_only));
  } else {
    MCC_ASSIGN_OR_RETURN(actions, TrainingActions(kind, m));
  }
  // Whether backwards are split into B and W (activations held until W).
  bool split = false;
  for (const Action& a : actions) split |= a.kind == Action::kWeight;
  PipelineStepResult result;
  PipelineStats& stats = result.stats;
  const bool loss_stage = stage_ == loss_stage_;
  if (loss_stage) result.microbatch_losses.resize(m);
  std::vector<std::vector<std::unique_ptr<parallel::ActivationRecord>>> records(
      v);
  for (auto& r : records) r.resize(m);

  // Transfers go in the batches PlanTransfers lays out (p2p.h), posted
  // after the unit before them, with no tags. A batch is waited for before
  // the first action whose input it brings, which releases what it sent.
  // With overlap_p2p a batch that only sends completes in the background,
  // and gloo cannot poll one (a wait that times out closes the connection),
  // so it is waited for where it has provably finished: one holding the
  // forward output of (chunk, micro-batch) once the gradient of that
  // micro-batch has come back (the peer received the output before
  // computing it), so at most the micro-batches in flight hold theirs;
  // others at the step's end. Without overlap_p2p every batch is waited for
  // at once (Megatron's send_forward_recv_backward and friends).
  const StageLayout layout{stages_, stage_, v, IsVShaped(kind)};
  // V-shaped, receives are planned from every stage's order (p2p.h).
  std::vector<std::vector<Action>> forward_only_orders;
  const std::vector<std::vector<Action>>* stage_actions = nullptr;
  if (layout.v_shape && stages_ > 1) {
    if (forward_only || m == 0) {
      for (int r = 0; r < stages_; ++r) {
        MCC_ASSIGN_OR_RETURN(
            std::vector<Action> order,
            BuildSchedule(kind, stages_, r, v, m, forward_only));
        forward_only_orders.push_back(std::move(order));
      }
      stage_actions = &forward_only_orders;
    } else {
      stage_actions = &stage_actions_.at(m);
    }
  }
  // What one chunk hands another on this stage (the V's turn), by the
  // consuming action's (chunk, micro-batch): forward outputs, then input
  // gradients.
  std::map<std::pair<int, int>, Tensor> local_inputs[2];
  const std::vector<TransferBatch> plan =
      stages_ > 1 ? PlanTransfers(layout, actions, stage_actions)
                  : std::vector<TransferBatch>();
  struct Posted {
    std::shared_ptr<comm::Work> work;
    // V-shaped, a batch's sends go as a work of their own, so that waiting
    // for its receives (some received ahead) does not wait for the peer to
    // take the send. Over NCCL's stream order the sends run first, which is
    // the plan's global order (p2p_test).
    std::shared_ptr<comm::Work> send_work;
    bool received = false;     // `work` (the receives) waited for.
    std::vector<Tensor> sent;  // Alive until the work is done.
    int held_outputs = 0;      // Forward outputs counted in held_outputs.
    bool waited = false;
  };
  std::vector<Posted> posted(plan.size());
  std::vector<Tensor> inputs(actions.size()), outputs(actions.size());
  std::vector<int> input_batch(actions.size(), -1);
  // Batch holding each (chunk, micro-batch)'s sent forward output, or -1.
  std::vector<std::vector<int>> output_batch(v, std::vector<int>(m, -1));
  int held_outputs = 0;
  auto name = [&](const Action& a) {
    return absl::StrCat("pipeline stage ", stage_, " of ", stages_, ", ",
                        a.kind == Action::kForward    ? "forward"
                        : a.kind == Action::kBackward ? "backward"
                                                      : "weight gradient",
                        " of micro-batch ", a.microbatch, " on chunk ",
                        a.chunk);
  };
  auto batch_name = [&](size_t b) {
    return plan[b].first_action < static_cast<int>(actions.size())
               ? absl::StrCat("transfers before the ",
                              name(actions[plan[b].first_action]))
               : absl::StrCat("pipeline stage ", stage_, " of ", stages_,
                              ", transfers after the last action");
  };
  auto wait_batch = [&](size_t b) -> absl::Status {
    Posted& p = posted[b];
    if (p.waited || (p.work == nullptr && p.send_work == nullptr)) {
      return absl::OkStatus();
    }
    p.waited = true;
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s =
        p.work != nullptr && !p.received ? p.work->Wait() : absl::OkStatus();
    if (s.ok() && p.send_work != nullptr) s = p.send_work->Wait();
    const std::string what = (p.work != nullptr ? p.work : p.send_work)->what();
    stats.wait_seconds += Seconds(t0);
    Trace(t0, [&](observability::TraceEvent* e) {
      e->name = plan[b].recv_actions.empty() ? "wait send" : "wait recv";
      e->category = "wait";
      e->args = {{"what", what}};
    });
    held_outputs -= p.held_outputs;
    p.sent.clear();
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat(batch_name(b), ": ", s.message()));
    }
    return absl::OkStatus();
  };
  auto post_batch = [&](size_t b) -> absl::Status {
    const TransferBatch& batch = plan[b];
    if (batch.empty()) return absl::OkStatus();
    std::vector<PipelineP2P::Transfer> sends, recvs;
    Posted& p = posted[b];
    for (int i : batch.send_actions) {
      sends.push_back({outputs[i], layout.Destination(actions[i])});
      p.sent.push_back(std::move(outputs[i]));
      outputs[i] = Tensor();
    }
    for (int i : batch.recv_actions) {
      const Action& a = actions[i];
      const parallel::PipelineStage* chunk = chunks_[a.chunk];
      absl::StatusOr<parallel::TensorSpec> spec =
          a.kind == Action::kForward ? chunk->InputSpec(a.microbatch)
                                     : chunk->OutputSpec(a.microbatch);
      if (!spec.ok()) {
        return absl::Status(
            spec.status().code(),
            absl::StrCat(name(a), ": ", spec.status().message()));
      }
      inputs[i] = Tensor::Empty(spec->shape, spec->dtype, spec->device);
      recvs.push_back({inputs[i], layout.Source(a)});
      input_batch[i] = static_cast<int>(b);
    }
    if (layout.v_shape && !sends.empty() && !recvs.empty()) {
      p.send_work = p2p_->Exchange(sends, {});
      p.work = p2p_->Exchange({}, recvs);
    } else {
      p.work = p2p_->Exchange(sends, recvs);
    }
    if (!options_.overlap_p2p) return wait_batch(b);
    if (batch.recv_actions.empty() || p.send_work != nullptr) {
      for (int i : batch.send_actions) {
        if (actions[i].kind != Action::kForward) continue;
        output_batch[actions[i].chunk][actions[i].microbatch] =
            static_cast<int>(b);
        ++p.held_outputs;
      }
      held_outputs += p.held_outputs;
      stats.max_held_outputs = std::max(stats.max_held_outputs, held_outputs);
    }
    return absl::OkStatus();
  };

  // Each micro-batch's loss, kept on its device.
  auto keep_loss = [&](const Action& a, Tensor loss_sum) -> absl::Status {
    if (!loss_sum.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name(a), ": the chunk computes the loss but returned no loss sum"));
    }
    result.microbatch_losses[a.microbatch] = std::move(loss_sum);
    return absl::OkStatus();
  };

  int in_flight = 0;
  size_t next_batch = 0;
  auto post_due = [&](size_t first_action) -> absl::Status {
    while (next_batch < plan.size() &&
           plan[next_batch].first_action == static_cast<int>(first_action)) {
      MCC_RETURN_IF_ERROR(post_batch(next_batch++));
    }
    return absl::OkStatus();
  };
  MCC_RETURN_IF_ERROR(post_due(0));
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (input_batch[i] >= 0) {
      Posted& p = posted[input_batch[i]];
      if (p.send_work != nullptr && !p.received && !p.waited) {
        // Only the receives; the sends complete at the peer's pace.
        const auto t0 = std::chrono::steady_clock::now();
        absl::Status s = p.work->Wait();
        stats.wait_seconds += Seconds(t0);
        Trace(t0, [&](observability::TraceEvent* e) {
          e->name = "wait recv";
          e->category = "wait";
          e->args = {{"what", p.work->what()}};
        });
        p.received = true;
        if (!s.ok()) {
          return absl::Status(s.code(), absl::StrCat(batch_name(input_batch[i]),
                                                     ": ", s.message()));
        }
      } else {
        MCC_RETURN_IF_ERROR(wait_batch(input_batch[i]));
      }
    }
    Tensor input = std::move(inputs[i]);
    inputs[i] = Tensor();
    if (layout.TakesLocalInput(a)) {
      auto& local = local_inputs[a.kind == Action::kForward ? 0 : 1];
      auto it = local.find({a.chunk, a.microbatch});
      if (it == local.end()) {
        return absl::InternalError(
            absl::StrCat(name(a),
                         ": runs before the action on this stage it takes its "
                         "input from"));
      }
      input = std::move(it->second);
      local.erase(it);
    }
    if (a.kind == Action::kBackward) {
      const int b = output_batch[a.chunk][a.microbatch];
      if (b >= 0) MCC_RETURN_IF_ERROR(wait_batch(b));
    }
    parallel::PipelineStage* chunk = chunks_[a.chunk];
    std::unique_ptr<parallel::ActivationRecord>& record =
        records[a.chunk][a.microbatch];
    const auto t0 = std::chrono::steady_clock::now();
    if (a.kind == Action::kForward) {
      auto y = chunk->ForwardStep(a.microbatch, input, !forward_only);
      if (!y.ok()) {
        return absl::Status(y.status().code(),
                            absl::StrCat(name(a), ": ", y.status().message()));
      }
      stats.forward_seconds += Seconds(t0);
      TraceAction(a, layout, forward_only, t0);
      if (!forward_only)
        stats.max_in_flight = std::max(stats.max_in_flight, ++in_flight);
      record = std::move(y->record);
      if (layout.ComputesLoss(a.chunk)) {
        MCC_RETURN_IF_ERROR(keep_loss(a, std::move(y->loss_sum)));
      } else {
        outputs[i] = std::move(y->output);
      }
    } else if (a.kind == Action::kBackward) {
      if (last_microbatch_) last_microbatch_(a.microbatch == m - 1);
      // Split: the record stays for the W row.
      auto dx = split
                    ? chunk->BackwardInputStep(input, grad_scale, &record)
                    : chunk->BackwardStep(input, grad_scale, std::move(record));
      if (!dx.ok()) {
        return absl::Status(dx.status().code(),
                            absl::StrCat(name(a), ": ", dx.status().message()));
      }
      stats.backward_seconds += Seconds(t0);
      TraceAction(a, layout, forward_only, t0);
      if (!split) --in_flight;
      if (!layout.TakesBatchInput(a.chunk)) outputs[i] = std::move(*dx);
    } else {
      if (last_microbatch_) last_microbatch_(a.microbatch == m - 1);
      absl::Status s = chunk->BackwardWeightStep(std::move(record));
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat(name(a), ": ", s.message()));
      }
      const double seconds = Seconds(t0);
      stats.backward_seconds += seconds;
      stats.weight_seconds += seconds;
      TraceAction(a, layout, forward_only, t0);
      --in_flight;
    }
    if (layout.Sends(a) && !outputs[i].defined()) {
      return absl::InternalError(
          absl::StrCat(name(a), ": the chunk returned no ",
                       a.kind == Action::kForward ? "output" : "input gradient",
                       " to send"));
    }
    if (layout.HandsOffLocally(a)) {
      const Action next = layout.LocalConsumer(a);
      if (!outputs[i].defined()) {
        return absl::InternalError(absl::StrCat(
            name(a), ": the chunk returned nothing to hand to chunk ",
            next.chunk));
      }
      local_inputs[a.kind == Action::kForward ? 0 : 1]
                  [{next.chunk, next.microbatch}] = std::move(outputs[i]);
      outputs[i] = Tensor();
    }
    MCC_RETURN_IF_ERROR(post_due(i + 1));
  }
  for (size_t b = 0; b < posted.size(); ++b) {
    MCC_RETURN_IF_ERROR(wait_batch(b));
  }
  if (loss_stage) {
    // Totalled on the losses' device in micro-batch order (no host read);
    // without micro-batches, zeros where a loss would have been.
    const Device device =
        m > 0 ? result.microbatch_losses[0].device()
              : (stages_ > 1 ? pipeline_->device() : Device::CPU());
    result.loss_totals =
        Tensor::Zeros({ops::kLossTotalsSize}, DType::kFloat32, device);
    for (int i = 0; i < m; ++i) {
      absl::Status s = ops::AccumulateLossTotals(result.microbatch_losses[i], m,
                                                 &result.loss_totals);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("pipeline stage ", stage_,
                                                   ", loss of micro-batch ", i,
                                                   ": ", s.message()));
      }
    }
  }
  MCC_RETURN_IF_ERROR(BroadcastLossTotals(&result.loss_totals));
  stats.total_seconds = Seconds(start);
  Trace(start, [&](observability::TraceEvent* e) {
    e->name = forward_only ? "pipeline schedule (eval)" : "pipeline schedule";
    e->category = forward_only ? "eval" : "schedule";
    e->args = {{"schedule", ScheduleName(kind)},
               {"stage", absl::StrCat(stage_)},
               {"microbatches", absl::StrCat(m)}};
  });
  stats.measured_bubble = stats.total_seconds > 0
                              ? std::max(0.0, 1.0 - (stats.forward_seconds +
                                                     stats.backward_seconds) /
                                                        stats.total_seconds)
                              : 0.0;
  // A table from a file has no formula; 1F1B's (interleaved's) is beside it.
  stats.theoretical_bubble = TheoreticalBubble(kind, stages_, v, m);
  return result;
}

}  // namespace pipeline
}  // namespace mcc
