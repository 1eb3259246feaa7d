#ifndef CORE_COMM_FLIGHT_RECORDER_H_
#define CORE_COMM_FLIGHT_RECORDER_H_

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace comm {

// One collective or point-to-point call as the flight recorder keeps it.
struct FlightRecord {
  int64_t id = 0;                // Order of issue on this rank.
  std::string group;             // Group name ("world", "dp", ...).
  std::vector<int> group_ranks;  // The group's members (global ranks).
  int global_rank = 0;           // This rank.
  std::string op;                // "AllReduce", "Send", ...
  std::string signature;         // "AllReduce(sum, fp32[3, 5])"
  int64_t seq = -1;              // Sequence number in the group; -1 for p2p.
  int64_t p2p_index = -1;        // Index among this group's p2p calls; -1 else.
  int peer = -1;  // Global rank of the p2p peer; -1 for collectives.
  int64_t bytes = 0;
  int64_t start_us = 0;  // Wall clock (microseconds since the epoch).
  int64_t end_us = -1;   // -1 while running.
  std::string state;     // "started", "completed" or "failed".
  std::string error;     // The failure's message.
};

// A ring of the last N collectives and p2p calls of this process (PyTorch's
// flight recorder): what each rank was doing when a job hangs.
//
// Every ProcessGroup records into Global(). Dumps are JSON files
// `flight_recorder_rank<R>.json` in the dump directory, written atomically:
//   - when a collective fails (a timeout, a lost peer),
//   - on SIGUSR1 (the job keeps running),
//   - on SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT, before the default
//     action.
// tools/analyze_hang merges the ranks' dumps and names the ranks behind.
//
// Thread-safety: every method may be called from any thread. Signal
// handlers only write one byte to a pipe; a watcher thread dumps.
// Errors: a failed dump is logged and returned; the ring is kept.
class FlightRecorder {
 public:
  static FlightRecorder& Global();

  // Entries kept (default 2048, or MCC_FLIGHT_RECORDER_ENTRIES).
  void set_capacity(int capacity);
  // Where dumps go (train --flight-recorder-dir; the default is
  // MCC_FLIGHT_RECORDER_DIR, else none: no dumps). Installs the signal
  // handlers the first time a directory is set.
  void SetDumpDirectory(std::string dir, int global_rank);
  std::string dump_directory() const;

  int64_t Start(FlightRecord record);
  void Finish(int64_t id, const absl::Status& status);

  std::vector<FlightRecord> Snapshot() const;
  std::string ToJson(absl::string_view reason) const;
  // Writes the dump now (no-op without a directory).
  absl::Status Dump(absl::string_view reason);

  static int64_t NowMicros();

 private:
  FlightRecorder();
  void InstallSignalHandlers();

  mutable std::mutex mu_;
  int capacity_;
  int64_t next_id_ = 0;
  std::deque<FlightRecord> ring_;
  std::string dir_;
  int rank_ = 0;
  bool handlers_installed_ = false;
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_FLIGHT_RECORDER_H_
