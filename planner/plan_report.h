#ifndef PLANNER_PLAN_REPORT_H_
#define PLANNER_PLAN_REPORT_H_

#include <string>
#include <vector>

#include "planner/job_spec.h"
#include "planner/layout_search.h"

namespace mcc {
namespace planner {

// One line a layout: memory per rank, step time, MFU, with a header.
std::string FormatTable(const JobSpec& job,
                        const std::vector<Prediction>& predictions);

// Every part of one prediction: memory by kind (with Megatron's
// theoretical estimate beside it), step time by part with what overlap
// hides, MFU and throughput, and whether the rank fits.
std::string FormatExplain(const JobSpec& job, const Prediction& prediction);

// The same as JSON (one object per prediction, in a "layouts" array, with
// the job and the device); "stage_memory" lists every pipeline stage's
// per-rank total.
std::string FormatJson(const JobSpec& job,
                       const std::vector<Prediction>& predictions);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_PLAN_REPORT_H_
