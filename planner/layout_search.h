#ifndef PLANNER_LAYOUT_SEARCH_H_
#define PLANNER_LAYOUT_SEARCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/job_spec.h"
#include "planner/layout.h"
#include "planner/memory_model.h"
#include "planner/step_time_model.h"

namespace mcc {
namespace planner {

// A layout with its predictions.
struct Prediction {
  Layout layout;
  MemoryBreakdown memory;  // The rank with the largest total.
  StepTime time;
  bool fits = false;
  // Why train cannot run it (empty when it can): torchtitan's op-level
  // recomputation, context parallelism with attention dropout.
  std::string unsupported;
};

// Predicts one layout; the error says what does not divide.
absl::StatusOr<Prediction> Predict(const JobSpec& job, const Layout& layout);

// Why train cannot run `layout` for `job`, or empty. Context parallelism
// is modelled as train's default --cp-comm-type p2p (ring attention).
std::string UnsupportedHere(const JobSpec& job, const Layout& layout);

struct SearchOptions {
  bool include_unsupported = false;  // Also layouts train cannot run yet.
  bool include_not_fitting = false;
  std::vector<int64_t> micro_batches;  // Empty: 1, 2, 4, ... up to 64.
};

// Every TP x PP (x virtual stages) x DP x CP x ZeRO x recomputation x
// micro-batch that divides the job (TP within a node), with each pipeline
// schedule (1F1B or interleaved, ZB-H1, ZB-V, the job's schedule file),
// HSDP instance count and, on GPUs, optimizer offload share it can run with,
// and, beside a pipeline's even split, the first and last stages' layers
// that balance its stages (stage_balance.h), predicted and sorted by step
// time, fitting layouts first.
std::vector<Prediction> SearchLayouts(const JobSpec& job,
                                      const SearchOptions& options);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_LAYOUT_SEARCH_H_
