#include "core/comm/backend.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/comm/flight_recorder.h"

namespace mcc {
namespace comm {

Backend::Backend(int rank, int size, std::string name,
                 std::vector<int> global_ranks, std::shared_ptr<Store> store,
                 GroupOptions options)
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      global_ranks_(std::move(global_ranks)),
      store_(std::move(store)),
      options_(std::move(options)) {}

Backend::~Backend() = default;

std::shared_ptr<Work> Backend::DoBatchP2P(const Call& call,
                                          std::vector<P2POp> ops) {
  std::vector<std::shared_ptr<Work>> works;
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const bool send = op.kind == P2POp::kSend;
    Call sub = call;
    sub.op = send ? "Send" : "Recv";
    sub.what = absl::StrCat(call.what, ", op ", i, " (", sub.op,
                            send ? " to rank " : " from rank ", op.peer, ")");
    works.push_back(send ? DoSend(sub, op.tensor, op.peer, op.tag)
                         : DoRecv(sub, op.tensor, op.peer, op.tag));
  }
  return Work::All(call.what, call.timeout, std::move(works));
}

absl::Status Backend::broken_status() {
  std::lock_guard<std::mutex> lock(broken_mu_);
  return broken_;
}

bool Backend::Break(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(broken_mu_);
  if (!broken_.ok()) return false;
  broken_ = status;
  return true;
}

std::vector<int> Backend::LostGroupMembers(absl::Duration wait) {
  std::vector<int> lost;
  if (options_.liveness_store == nullptr) return lost;
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    absl::StatusOr<std::vector<int>> ranks =
        options_.liveness_store->LostRanks();
    if (!ranks.ok()) {
      // The store lives in global rank 0's process.
      lost.push_back(0);
      return lost;
    }
    for (int g : *ranks) {
      if (std::find(global_ranks_.begin(), global_ranks_.end(), g) !=
          global_ranks_.end()) {
        lost.push_back(g);
      }
    }
    if (!lost.empty() || absl::Now() >= deadline) return lost;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status Backend::Fail(const Call& call, absl::StatusCode code,
                           absl::string_view detail) {
  std::vector<int> lost = LostGroupMembers(
      code == absl::StatusCode::kDeadlineExceeded ? absl::Milliseconds(300)
                                                  : absl::Seconds(2));
  std::string message = absl::StrCat(call.what, " failed: ", detail);
  if (!lost.empty()) {
    std::vector<std::string> names;
    for (int g : lost) {
      const int r = static_cast<int>(
          std::find(global_ranks_.begin(), global_ranks_.end(), g) -
          global_ranks_.begin());
      names.push_back(g == r ? absl::StrCat(r)
                             : absl::StrCat(r, " (global rank ", g, ")"));
    }
    absl::StrAppend(&message, "; lost rank ", absl::StrJoin(names, ", "),
                    ": its process died or exited (connection to the "
                    "rendezvous store dropped)");
    code = absl::StatusCode::kUnavailable;
  }
  absl::Status status(code, message);
  // What this rank was doing, for tools/analyze_hang.
  if (Break(status)) FlightRecorder::Global().Dump(message).IgnoreError();
  return status;
}

}  // namespace comm
}  // namespace mcc
