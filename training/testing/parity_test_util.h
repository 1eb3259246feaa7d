#ifndef TRAINING_TESTING_PARITY_TEST_UTIL_H_
#define TRAINING_TESTING_PARITY_TEST_UTIL_H_

// What the multi-process parity tests (data parallel, pipeline, FSDP)
// share: joining the world in a worker, running a case's workers and reading
// rank 0's result, and comparing it step by step with the serial run.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "parallel/parallel_state.h"
#include "training/testing/train_test_util.h"

namespace mcc {
namespace optim {
namespace testing {

// The case called `name` (a worker's MCC_TEST_CASE); an unknown name aborts
// the worker, saying so.
template <typename Case>
const Case& FindCase(const std::vector<Case>& cases, const std::string& name) {
  for (const Case& c : cases) {
    if (c.name == name) return c;
  }
  std::fprintf(stderr, "unknown case %s\n", name.c_str());
  std::abort();
}

// In a worker: joins the world from the launcher's environment (60 s
// timeouts) and creates the groups of `sizes`.
absl::StatusOr<std::unique_ptr<parallel::ParallelState>> InitWorkerState(
    parallel::ParallelSizes sizes);

// Runs `world` workers named `worker` with MCC_TEST_CASE=case_name; each
// must exit 0, and rank 0 must have written its TrainResult to
// TmpPath(case_name + ".txt") (WriteResult). Returns that result, or an
// error with every worker's output.
absl::StatusOr<TrainResult> RunParityWorkers(int world,
                                             const std::string& worker,
                                             const std::string& case_name,
                                             absl::Duration timeout);

// Compares the first `steps` steps: loss within loss_tol and, on steps the
// serial run did not skip, grad norm within norm_tol (relative); EXPECTs
// with the step named. Returns the worst relative loss difference.
double ExpectMatchesSerial(const TrainResult& parallel,
                           const TrainResult& serial, int steps,
                           double loss_tol, double norm_tol);

}  // namespace testing
}  // namespace optim
}  // namespace mcc

#endif  // TRAINING_TESTING_PARITY_TEST_UTIL_H_
