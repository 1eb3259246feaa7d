#ifndef PLANNER_PUBLISHED_RUNS_H_
#define PLANNER_PUBLISHED_RUNS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/job_spec.h"
#include "planner/layout.h"
#include "planner/layout_search.h"

namespace mcc {
namespace planner {

// A training run whose throughput was published, with its configuration as
// published. Settings the publication does not state are fixed by a stated
// assumption (`assumed`); the micro-batch and virtual pipeline stages, when
// unstated, are left to the planner (its first choice among them: fitting,
// then fastest), since the publishers tuned them and did not say to what.
struct PublishedRun {
  std::string name;     // "megatron weak 1.7B", "torchtitan llama3 8B FSDP"
  std::string source;   // Where the numbers are: URL, file, commit, figure.
  std::string assumed;  // What was not published and how it is set here.
  JobSpec job;
  Layout layout;
  bool search_virtual_stages = false;  // Every divisor of layers per stage.
  bool search_micro_batch = false;     // 1, 2, 4, 8, 16.
  // Whether a searched choice fits is judged by Megatron's own
  // theoretical_memory_usage (the published system's memory), not by this
  // project's memory model, which holds more than Megatron does.
  bool fit_by_megatron_formula = false;
  double published_mfu = 0;  // Fraction of published_peak_flops.
  // The peak the publication divides by (both: the H100 SXM's 989 TFLOP/s
  // dense bf16), which may not be the device's (job.cluster.device).
  double published_peak_flops = 989e12;
  double published_tokens_per_gpu = 0;  // tokens/s/GPU; 0: not published.
};

// Megatron-LM's H100 weak-scaling table and GPT-3 175B strong scaling, and
// torchtitan's Llama 3.1 8B FSDP run on 8 H100.
std::vector<PublishedRun> PublishedRuns();

struct PublishedComparison {
  PublishedRun run;
  // With the micro-batch and virtual stages chosen, if searched. It may
  // not fit this project's memory model (prediction.fits): this project
  // holds more than the published system did, and the step time is still
  // predicted.
  Prediction prediction;
  bool fits_published_system = false;  // By the criterion above.
  double predicted_mfu = 0;            // Against published_peak_flops.
  double predicted_tokens_per_gpu = 0;
  // Predicted minus published MFU, in percentage points.
  double mfu_error_points = 0;
};

// Predicts `run` with the planner; the error names the run and says what
// does not divide when no choice of the searched settings does.
absl::StatusOr<PublishedComparison> ComparePublished(const PublishedRun& run);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_PUBLISHED_RUNS_H_
