#include "observability/comm_trace.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace observability {

comm::CallObserver::Done CommTraceObserver::OnIssue(
    const comm::ObservedCall& call) {
  if (!recorder_->enabled()) return nullptr;
  TraceEvent event;
  const bool p2p = call.seq < 0;
  event.name =
      p2p ? absl::StrCat(call.op, " #", call.p2p_index,
                         call.op == "Recv" ? " from rank " : " to rank ",
                         call.peer)
          : absl::StrCat(call.op, " #", call.seq);
  event.category = p2p ? "p2p" : "comm";
  event.start_us = TraceRecorder::NowMicros();
  event.args = {{"group", call.group},
                {"bytes", absl::StrCat(call.bytes)},
                {"seq", absl::StrCat(p2p ? call.p2p_index : call.seq)},
                {"signature", call.signature}};
  if (p2p) event.args.emplace_back("peer", absl::StrCat(call.peer));
  // The step the call was issued in, not the one it finishes in.
  const int64_t step = recorder_->step();
  if (step >= 0) event.args.emplace_back("issued_in_step", absl::StrCat(step));
  return [this, group = call.group,
          event = std::move(event)](const absl::Status& status) mutable {
    event.duration_us = TraceRecorder::NowMicros() - event.start_us;
    if (!status.ok()) {
      event.args.emplace_back("error", std::string(status.message()));
    }
    Finished(group, std::move(event));
  };
}

void CommTraceObserver::Finished(const std::string& group, TraceEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Lane>& lanes = lanes_[group];
  // The first of the group's tracks whose last event ended before this one
  // began: events of a track then never overlap.
  Lane* lane = nullptr;
  for (Lane& l : lanes) {
    if (l.end_us <= event.start_us) {
      lane = &l;
      break;
    }
  }
  if (lane == nullptr) {
    lanes.push_back({next_track_++, 0});
    lane = &lanes.back();
    recorder_->NameTrack(
        lane->track, lanes.size() == 1
                         ? absl::StrCat("comm ", group)
                         : absl::StrCat("comm ", group, " #", lanes.size()));
  }
  lane->end_us = event.start_us + event.duration_us;
  event.track = lane->track;
  recorder_->Record(std::move(event));
}

}  // namespace observability
}  // namespace mcc
