#include "observability/comm_trace.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace observability {

CommTraceObserver::CommTraceObserver(TraceRecorder* recorder, int first_track)
    : state_(std::make_shared<State>()) {
  state_->recorder = recorder;
  state_->next_track = first_track;
}

comm::CallObserver::Done CommTraceObserver::OnIssue(
    const comm::ObservedCall& call) {
  if (!state_->recorder->enabled()) return nullptr;
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
  const int64_t step = state_->recorder->step();
  if (step >= 0) event.args.emplace_back("issued_in_step", absl::StrCat(step));
  return [state = state_, group = call.group,
          event = std::move(event)](const absl::Status& status) mutable {
    event.duration_us = TraceRecorder::NowMicros() - event.start_us;
    if (!status.ok()) {
      event.args.emplace_back("error", std::string(status.message()));
    }
    state->Finished(group, std::move(event));
  };
}

void CommTraceObserver::LabelGroup(const std::string& group,
                                   std::string label) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->labels.emplace(group, std::move(label));
}

void CommTraceObserver::State::Finished(const std::string& group,
                                        TraceEvent event) {
  std::lock_guard<std::mutex> lock(mu);
  auto label = labels.find(group);
  if (label != labels.end()) event.args.emplace_back("role", label->second);
  std::vector<Lane>& group_lanes = lanes[group];
  // The first of the group's tracks whose last event ended before this one
  // began: events of a track then never overlap.
  Lane* lane = nullptr;
  for (Lane& l : group_lanes) {
    if (l.end_us <= event.start_us) {
      lane = &l;
      break;
    }
  }
  if (lane == nullptr) {
    group_lanes.push_back({next_track++, 0});
    lane = &group_lanes.back();
    std::string track =
        label == labels.end()
            ? absl::StrCat("comm ", group)
            : absl::StrCat("comm ", label->second, " (", group, ")");
    if (group_lanes.size() > 1) {
      absl::StrAppend(&track, " #", group_lanes.size());
    }
    recorder->NameTrack(lane->track, std::move(track));
  }
  lane->end_us = event.start_us + event.duration_us;
  event.track = lane->track;
  recorder->Record(std::move(event));
}

}  // namespace observability
}  // namespace mcc
