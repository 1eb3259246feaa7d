#include "parallel/pipeline/pipeline_executor.h"

#include <chrono>
#include <cstring>
#include <list>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace mcc {
namespace pipeline {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(
    std::vector<gpt::GPTModel*> chunks, comm::ProcessGroup* pipeline,
    PipelineOptions options) {
  if (chunks.empty()) {
    return absl::InvalidArgumentError("pipeline: no model chunks");
  }
  auto e = std::unique_ptr<PipelineExecutor>(new PipelineExecutor);
  e->chunks_ = std::move(chunks);
  e->pipeline_ = pipeline;
  e->options_ = options;
  e->stages_ = pipeline != nullptr ? pipeline->size() : 1;
  e->stage_ = pipeline != nullptr ? pipeline->rank() : 0;
  if (e->stages_ > 1) e->p2p_ = std::make_unique<PipelineP2P>(pipeline);
  const int v = static_cast<int>(e->chunks_.size());
  if (e->stage_ == 0 && !e->chunks_[0]->chunk().pre_process) {
    return absl::InvalidArgumentError(
        "pipeline: the first stage's first chunk must hold the embeddings");
  }
  if (e->stage_ == e->stages_ - 1 && !e->chunks_[v - 1]->chunk().post_process) {
    return absl::InvalidArgumentError(
        "pipeline: the last stage's last chunk must hold the output layer");
  }
  if (options.schedule == ScheduleKind::kNoPipelining && e->stages_ > 1) {
    options.schedule = ScheduleKind::kOneFOneB;
    e->options_ = options;
  }
  return e;
}

bool PipelineExecutor::NeedsRecv(const Action& a) const {
  const int v = static_cast<int>(chunks_.size());
  if (a.kind == Action::kForward) return !(stage_ == 0 && a.chunk == 0);
  return !(stage_ == stages_ - 1 && a.chunk == v - 1);
}

absl::Status PipelineExecutor::BroadcastLosses(
    std::vector<gpt::LossSum>* losses) {
  if (stages_ == 1) return absl::OkStatus();
  const int64_t m = static_cast<int64_t>(losses->size());
  // Doubles travel bit for bit as int64.
  Tensor t = Tensor::Zeros({2 * m}, DType::kInt64);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < m; ++i) {
    std::memcpy(&p[2 * i], &(*losses)[i].sum, sizeof(double));
    std::memcpy(&p[2 * i + 1], &(*losses)[i].tokens, sizeof(double));
  }
  MCC_RETURN_IF_ERROR(pipeline_->BroadcastSync(&t, stages_ - 1));
  for (int64_t i = 0; i < m; ++i) {
    std::memcpy(&(*losses)[i].sum, &p[2 * i], sizeof(double));
    std::memcpy(&(*losses)[i].tokens, &p[2 * i + 1], sizeof(double));
  }
  return absl::OkStatus();
}

absl::StatusOr<PipelineStepResult> PipelineExecutor::Run(
    const std::vector<gpt::MicroBatch>& batches, float grad_scale,
    bool forward_only) {
  const auto start = std::chrono::steady_clock::now();
  const int m = static_cast<int>(batches.size());
  const int v = static_cast<int>(chunks_.size());
  ScheduleKind kind = options_.schedule;
  if (v > 1) kind = ScheduleKind::kInterleaved;
  MCC_ASSIGN_OR_RETURN(
      std::vector<Action> actions,
      BuildSchedule(kind, stages_, stage_, v, m, forward_only));
  PipelineStepResult result;
  PipelineStats& stats = result.stats;
  result.losses.assign(m, gpt::LossSum());
  std::vector<std::vector<gpt::ChunkRecord>> records(
      v, std::vector<gpt::ChunkRecord>(m));

  struct Transfer {
    Tensor buffer;
    std::shared_ptr<comm::Work> work;
  };
  std::vector<Transfer> recvs(actions.size());
  std::list<Transfer> sends;
  auto post_recv = [&](size_t i) {
    if (i >= actions.size() || recvs[i].work != nullptr) return;
    const Action& a = actions[i];
    if (!NeedsRecv(a)) return;
    const gpt::GPTModel* chunk = chunks_[a.chunk];
    const Tensor& tokens = batches[a.microbatch].tokens;
    recvs[i].buffer =
        Tensor::Empty(chunk->HiddenShape(tokens.size(0), tokens.size(1)),
                      chunk->context().dtype);
    recvs[i].work = a.kind == Action::kForward
                        ? p2p_->RecvForward(&recvs[i].buffer, a.chunk)
                        : p2p_->RecvBackward(&recvs[i].buffer, a.chunk);
  };
  auto wait = [&](const std::shared_ptr<comm::Work>& work) -> absl::Status {
    if (work == nullptr) return absl::OkStatus();
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = work->Wait();
    stats.wait_seconds += Seconds(t0);
    return s;
  };
  auto name = [&](const Action& a) {
    return absl::StrCat("pipeline stage ", stage_, " of ", stages_, ", ",
                        a.kind == Action::kForward ? "forward" : "backward",
                        " of micro-batch ", a.microbatch, " on chunk ",
                        a.chunk);
  };

  int in_flight = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    post_recv(i);
    if (options_.overlap_p2p) post_recv(i + 1);
    absl::Status received = wait(recvs[i].work);
    if (!received.ok()) {
      return absl::Status(received.code(),
                          absl::StrCat(name(a), ": ", received.message()));
    }
    Tensor input = std::move(recvs[i].buffer);
    recvs[i] = Transfer();
    gpt::GPTModel* chunk = chunks_[a.chunk];
    gpt::ChunkRecord& record = records[a.chunk][a.microbatch];
    std::shared_ptr<comm::Work> sent;
    Tensor out;
    const auto t0 = std::chrono::steady_clock::now();
    if (a.kind == Action::kForward) {
      auto y = chunk->ForwardStep(batches[a.microbatch], input, !forward_only,
                                  &record);
      if (!y.ok()) {
        return absl::Status(y.status().code(),
                            absl::StrCat(name(a), ": ", y.status().message()));
      }
      stats.forward_seconds += Seconds(t0);
      if (!forward_only)
        stats.max_in_flight = std::max(stats.max_in_flight, ++in_flight);
      if (stage_ == stages_ - 1 && a.chunk == v - 1) {
        result.losses[a.microbatch] = record.loss;
        if (forward_only) record = gpt::ChunkRecord();
      } else {
        out = std::move(*y);
        sent = p2p_->SendForward(out,
                                 stage_ == stages_ - 1 ? a.chunk + 1 : a.chunk);
      }
    } else {
      if (last_microbatch_) last_microbatch_(a.microbatch == m - 1);
      auto dx = chunk->BackwardStep(input, grad_scale, &record);
      if (!dx.ok()) {
        return absl::Status(dx.status().code(),
                            absl::StrCat(name(a), ": ", dx.status().message()));
      }
      stats.backward_seconds += Seconds(t0);
      --in_flight;
      if (!(stage_ == 0 && a.chunk == 0)) {
        out = std::move(*dx);
        sent = p2p_->SendBackward(out, stage_ == 0 ? a.chunk - 1 : a.chunk);
      }
    }
    if (!options_.overlap_p2p) {
      // Batched as Megatron's send_forward_recv_backward and friends.
      post_recv(i + 1);
      MCC_RETURN_IF_ERROR(wait(sent));
      if (i + 1 < actions.size()) {
        absl::Status s = wait(recvs[i + 1].work);
        if (!s.ok()) {
          return absl::Status(
              s.code(), absl::StrCat(name(actions[i + 1]), ": ", s.message()));
        }
      }
    } else if (sent != nullptr) {
      // Sends complete in the background; their buffers are held until the
      // step ends (gloo cannot be polled without closing the connection).
      sends.push_back({out, sent});
    }
  }
  for (Transfer& t : sends) MCC_RETURN_IF_ERROR(wait(t.work));
  MCC_RETURN_IF_ERROR(BroadcastLosses(&result.losses));
  stats.total_seconds = Seconds(start);
  stats.measured_bubble = stats.total_seconds > 0
                              ? std::max(0.0, 1.0 - (stats.forward_seconds +
                                                     stats.backward_seconds) /
                                                        stats.total_seconds)
                              : 0.0;
  stats.theoretical_bubble = TheoreticalBubble(kind, stages_, v, m);
  return result;
}

}  // namespace pipeline
}  // namespace mcc
