#ifndef OBSERVABILITY_COMM_TRACE_H_
#define OBSERVABILITY_COMM_TRACE_H_

#include <cstdint>
#include <map>
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
// Calls of one group go to the group's track ("comm dp"); a call that
// overlaps the track's last one (asynchronous buckets, a send beside a
// receive) goes to a further track of the group ("comm pp #2"), so no two
// events of a track overlap and every viewer draws them as they were.
//
// Install with comm::SetCallObserver(&observer) while profiling. The
// observer must outlive every call issued while installed.
// Thread-safety: OnIssue and the callbacks may run on any thread.
class CommTraceObserver : public comm::CallObserver {
 public:
  // Tracks are numbered from first_track upwards.
  explicit CommTraceObserver(TraceRecorder* recorder, int first_track = 10)
      : recorder_(recorder), next_track_(first_track) {}

  Done OnIssue(const comm::ObservedCall& call) override;

 private:
  void Finished(const std::string& group, TraceEvent event);

  TraceRecorder* recorder_;
  std::mutex mu_;
  int next_track_;
  struct Lane {
    int track;
    int64_t end_us;
  };
  std::map<std::string, std::vector<Lane>> lanes_;  // By group.
};

}  // namespace observability
}  // namespace mcc

#endif  // OBSERVABILITY_COMM_TRACE_H_
