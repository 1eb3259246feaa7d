#ifndef OBSERVABILITY_COMM_TRACE_H_
#define OBSERVABILITY_COMM_TRACE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/comm/call_observer.h"
#include "observability/trace.h"

namespace mcc {
namespace observability {

// Draws every collective and p2p call on a TraceRecorder's timeline: one
// event from issue until the call is seen finished, named "AllReduce #7"
// (sequence number in the group) or "Send #3 to rank 1" (p2p index), with
// the group, bytes, sequence number, peer, signature and status as
// arguments, in category "comm" (collectives) or "p2p".
//
// Calls of one group go to the group's track ("comm world/sub2[0,1]", or
// "comm pp (world/sub2[0,1])" once labelled); a call that overlaps the
// track's last one (asynchronous buckets, a send beside a receive) goes to
// a further track of the group ("... #2"), so no two events of a track
// overlap and every viewer draws them as they were. An event lasts from
// issue until the call is seen finished: for a gloo send, that is when it
// is waited for.
//
// Install with comm::SetCallObserver(&observer) while profiling; calls
// still in flight when it is removed or destroyed are recorded if the
// recorder is still enabled, and are safe either way.
// Thread-safety: OnIssue and the callbacks may run on any thread.
class CommTraceObserver : public comm::CallObserver {
 public:
  // Tracks are numbered from first_track upwards.
  explicit CommTraceObserver(TraceRecorder* recorder, int first_track = 10);

  Done OnIssue(const comm::ObservedCall& call) override;

  // Names the role of a group ("pp", "dp", ...): its tracks read
  // "comm pp (world/sub2[0,1])" and its events carry a "role" argument.
  // The first label a group gets stays.
  void LabelGroup(const std::string& group, std::string label);

 private:
  // Shared with the callbacks of calls in flight, which may finish after
  // the observer is gone (a backend thread runs them after waking the
  // waiter).
  struct State {
    TraceRecorder* recorder;
    std::mutex mu;
    int next_track;
    struct Lane {
      int track;
      int64_t end_us;
    };
    std::map<std::string, std::vector<Lane>> lanes;  // By group.
    std::map<std::string, std::string> labels;       // By group.
    void Finished(const std::string& group, TraceEvent event);
  };
  std::shared_ptr<State> state_;
};

}  // namespace observability
}  // namespace mcc

#endif  // OBSERVABILITY_COMM_TRACE_H_
