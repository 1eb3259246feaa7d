#ifndef CORE_COMM_CALL_OBSERVER_H_
#define CORE_COMM_CALL_OBSERVER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"

namespace mcc {
namespace comm {

// What a process group tells an observer about one collective or
// point-to-point call as it is issued. The references live only for the
// duration of CallObserver::OnIssue.
struct ObservedCall {
  const std::string& group;      // Group name ("world", "dp", "pp", ...).
  const std::string& op;         // "AllReduce", "Send", ...
  const std::string& signature;  // "AllReduce(sum, fp32[3, 5])"
  int64_t seq;                   // Sequence number in the group; -1 for p2p.
  int64_t p2p_index;             // Index among the group's p2p calls; else -1.
  int peer;                      // Global rank of the p2p peer; else -1.
  int64_t bytes;
};

// Watches every collective and p2p call of this process (train --profile
// draws them on its timeline). At most one observer is installed at a time;
// with none, a call costs one relaxed atomic load and nothing else (no
// allocation, no lock).
//
// Thread-safety: OnIssue runs on the thread that issues the call; the
// callback it returns runs once, on whichever thread sees the call finish
// (a backend's worker or a waiter), with the call's final status.
class CallObserver {
 public:
  using Done = std::function<void(const absl::Status&)>;
  virtual ~CallObserver() = default;
  // May return an empty function when the call is of no interest.
  virtual Done OnIssue(const ObservedCall& call) = 0;
};

// Installs `observer` (not owned; it must outlive every call issued while
// it is installed and every callback it returned), or removes it with null.
void SetCallObserver(CallObserver* observer);
CallObserver* CurrentCallObserver();

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_CALL_OBSERVER_H_
