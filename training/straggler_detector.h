#ifndef TRAINING_STRAGGLER_DETECTOR_H_
#define TRAINING_STRAGGLER_DETECTOR_H_

// Finds the slow ranks of a job, as Megatron's --log-straggler does: every
// log interval each rank measures its own time over the window's steps and
// the times are gathered, so the slowest ranks are named with their ratio to
// the median.
//
// In a synchronous job every rank's step takes as long as the slowest
// rank's, so the wall time per step says nothing about who is slow. What a
// rank did itself does: its busy time (the step's wall time less the time
// its thread was blocked waiting on peers in collectives and p2p,
// comm::ThreadSecondsBlockedInWait) and its GEMM time (OpProfile's Gemm,
// BatchedGemm and Int8Gemm entries, which the detector enables). A rank on
// a slow or shared core, or throttled, has the larger busy and GEMM times;
// its peers have the larger waits instead. On a device the GEMM figure is
// the host's time in the GEMM calls (launches), so the busy time is the one
// to read there.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"

namespace mcc {
namespace training {

// One rank's averages per step over a window.
struct RankStepTimes {
  double step_seconds = 0;
  double busy_seconds = 0;  // step_seconds less the time blocked on peers
  double gemm_seconds = 0;
};

struct StragglerReport {
  std::vector<RankStepTimes> ranks;  // By global rank.
  // The lower median over ranks (the middle, or the faster of the two middle
  // ranks), so one slow rank of two does not hide in the average.
  double median_busy_seconds = 0;
  double median_gemm_seconds = 0;
  // Ranks whose busy time is above threshold x the median, slowest first.
  std::vector<int> stragglers;
  double threshold = 0;

  // One line: the window, the median, the slowest and fastest `minmax`
  // ranks with their ratios, and the stragglers named (or "none").
  std::string Format(int minmax) const;
};

// Pure: the medians and the stragglers of `ranks` (threshold > 1).
StragglerReport AnalyzeStepTimes(std::vector<RankStepTimes> ranks,
                                 double threshold);

class StragglerDetector {
 public:
  // `world` spans every rank (null for a single process, which reports on
  // itself); not owned. Enables OpProfile for the GEMM times.
  StragglerDetector(comm::ProcessGroup* world, double threshold);

  // Starts a window now (call after anything that resets OpProfile).
  void StartWindow();
  // Ends the window over `steps` steps: gathers every rank's times
  // (collective over `world`) and returns the report, the same on every
  // rank. Call from the thread that drives the steps.
  absl::StatusOr<StragglerReport> EndWindow(int steps);

 private:
  comm::ProcessGroup* world_;
  double threshold_;
  double window_start_seconds_ = 0;  // Monotonic clock.
  double blocked_at_start_ = 0;
  double gemm_at_start_ = 0;
};

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_STRAGGLER_DETECTOR_H_
