#include "inference/distributed_step.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace mcc {
namespace inference {
namespace {

enum Command : int64_t { kStep = 0, kIdle = 1, kShutdown = 2 };

template <typename T>
Tensor View(std::vector<T>* v) {
  return Tensor::FromExternal(v->data(), {static_cast<int64_t>(v->size())},
                              DTypeOf<T>::value, Device::CPU(), nullptr);
}

// Rank 0 sends (command, payload); the others receive it.
absl::Status BroadcastCommand(comm::ProcessGroup* world, int64_t* command,
                              std::vector<int64_t>* payload) {
  std::vector<int64_t> header = {*command,
                                 static_cast<int64_t>(payload->size())};
  Tensor h = View(&header);
  MCC_RETURN_IF_ERROR(world->BroadcastSync(&h, 0));
  *command = header[0];
  payload->resize(header[1]);
  if (header[1] == 0) return absl::OkStatus();
  Tensor p = View(payload);
  return world->BroadcastSync(&p, 0);
}

// This rank's stage of the step; on rank 0 returns the logits.
absl::StatusOr<std::vector<float>> RunStage(ModelRunner* runner,
                                            const StageLayout& layout,
                                            const StepRows& rows) {
  const int64_t h = runner->weights().config.hidden_size;
  std::vector<float> hidden;
  if (layout.pp_rank > 0) {
    hidden.resize(rows.rows() * h);
    Tensor t = View(&hidden);
    MCC_RETURN_IF_ERROR(layout.pipeline->RecvSync(&t, layout.pp_rank - 1));
  }
  MCC_ASSIGN_OR_RETURN(std::vector<float> logits, runner->Run(rows, &hidden));
  const bool last = layout.pp_rank == layout.pp_size - 1;
  if (!last) {
    Tensor t = View(&hidden);
    MCC_RETURN_IF_ERROR(layout.pipeline->SendSync(t, layout.pp_rank + 1));
    if (layout.pp_rank == 0 && layout.tp_rank == 0) {
      // Rank 0 gets the logits from the last stage.
      logits.resize(rows.logit_rows.size() *
                    runner->weights().config.vocab_size);
      if (!logits.empty()) {
        Tensor l = View(&logits);
        MCC_RETURN_IF_ERROR(
            layout.pipeline->RecvSync(&l, layout.pp_size - 1, /*tag=*/1));
      }
    }
    return logits;
  }
  if (layout.pp_size > 1 && layout.tp_rank == 0 && !logits.empty()) {
    Tensor l = View(&logits);
    MCC_RETURN_IF_ERROR(layout.pipeline->SendSync(l, 0, /*tag=*/1));
  }
  return logits;
}

}  // namespace

std::vector<int64_t> SerializeRows(const StepRows& rows) {
  std::vector<int64_t> w = {rows.rows(),
                            static_cast<int64_t>(rows.logit_rows.size()),
                            static_cast<int64_t>(rows.tables.size())};
  w.insert(w.end(), rows.tokens.begin(), rows.tokens.end());
  w.insert(w.end(), rows.positions.begin(), rows.positions.end());
  w.insert(w.end(), rows.table.begin(), rows.table.end());
  w.insert(w.end(), rows.logit_rows.begin(), rows.logit_rows.end());
  for (const BlockTable& t : rows.tables) {
    w.push_back(static_cast<int64_t>(t.size()));
    w.insert(w.end(), t.begin(), t.end());
  }
  return w;
}

absl::StatusOr<StepRows> DeserializeRows(const std::vector<int64_t>& w) {
  auto bad = [&]() {
    return absl::InvalidArgumentError(absl::StrCat(
        "a step's broadcast rows are malformed (", w.size(), " words)"));
  };
  if (w.size() < 3) return bad();
  const int64_t n = w[0], l = w[1], t = w[2];
  if (n < 0 || l < 0 || t < 0 ||
      static_cast<int64_t>(w.size()) < 3 + 3 * n + l + t) {
    return bad();
  }
  StepRows rows;
  size_t i = 3;
  rows.tokens.assign(w.begin() + i, w.begin() + i + n);
  i += n;
  rows.positions.assign(w.begin() + i, w.begin() + i + n);
  i += n;
  rows.table.assign(w.begin() + i, w.begin() + i + n);
  i += n;
  rows.logit_rows.assign(w.begin() + i, w.begin() + i + l);
  i += l;
  for (int64_t k = 0; k < t; ++k) {
    if (i >= w.size()) return bad();
    const int64_t len = w[i++];
    if (len < 0 || i + len > w.size()) return bad();
    rows.tables.emplace_back(w.begin() + i, w.begin() + i + len);
    i += len;
  }
  return rows;
}

absl::StatusOr<std::vector<float>> DistributedStepExecutor::Execute(
    const StepRows& rows) {
  int64_t command = kStep;
  std::vector<int64_t> payload = SerializeRows(rows);
  MCC_RETURN_IF_ERROR(BroadcastCommand(layout_.world, &command, &payload));
  return RunStage(runner_, layout_, rows);
}

absl::Status DistributedStepExecutor::Idle() {
  int64_t command = kIdle;
  std::vector<int64_t> none;
  return BroadcastCommand(layout_.world, &command, &none);
}

absl::Status DistributedStepExecutor::Shutdown() {
  int64_t command = kShutdown;
  std::vector<int64_t> none;
  return BroadcastCommand(layout_.world, &command, &none);
}

std::unique_ptr<StepExecutor> MakeStepExecutor(ModelRunner* runner,
                                               const StageLayout& layout) {
  if (layout.world == nullptr) {
    return std::make_unique<LocalStepExecutor>(runner);
  }
  return std::make_unique<DistributedStepExecutor>(runner, layout);
}

absl::Status FollowSteps(ModelRunner* runner, const StageLayout& layout) {
  while (true) {
    int64_t command = 0;
    std::vector<int64_t> payload;
    MCC_RETURN_IF_ERROR(BroadcastCommand(layout.world, &command, &payload));
    if (command == kShutdown) return absl::OkStatus();
    if (command == kIdle) continue;
    MCC_ASSIGN_OR_RETURN(StepRows rows, DeserializeRows(payload));
    MCC_RETURN_IF_ERROR(RunStage(runner, layout, rows).status());
  }
}

}  // namespace inference
}  // namespace mcc
