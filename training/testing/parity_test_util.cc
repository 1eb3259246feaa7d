#include "training/testing/parity_test_util.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace mcc {
namespace optim {
namespace testing {

absl::StatusOr<std::unique_ptr<parallel::ParallelState>> InitWorkerState(
    parallel::ParallelSizes sizes) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  // The world outlives the state's groups.
  static auto* world = new comm::World;
  MCC_ASSIGN_OR_RETURN(*world, comm::InitWorldFromEnvironment(options));
  return parallel::ParallelState::Create(world->group, sizes);
}

absl::StatusOr<TrainResult> RunParityWorkers(int world,
                                             const std::string& worker,
                                             const std::string& case_name,
                                             absl::Duration timeout) {
  auto results = comm::testing::RunWorkers(world, worker, timeout, [&](int) {
    return std::map<std::string, std::string>{{"MCC_TEST_CASE", case_name}};
  });
  for (const auto& r : results) {
    if (r.exit_code != 0) {
      return absl::InternalError(
          absl::StrCat(case_name, ": rank ", r.rank, " exited with ",
                       r.exit_code, "\n", comm::testing::Describe(results)));
    }
  }
  return ReadResult(TmpPath(case_name + ".txt"));
}

double ExpectMatchesSerial(const TrainResult& parallel,
                           const TrainResult& serial, int steps,
                           double loss_tol, double norm_tol) {
  EXPECT_GE(static_cast<int>(parallel.loss.size()), steps);
  EXPECT_GE(static_cast<int>(serial.loss.size()), steps);
  const int n =
      std::min<int>(steps, std::min(parallel.loss.size(), serial.loss.size()));
  double worst = 0;
  for (int s = 0; s < n; ++s) {
    SCOPED_TRACE(absl::StrCat("step ", s));
    const double d = RelDiff(parallel.loss[s], serial.loss[s]);
    worst = std::max(worst, d);
    EXPECT_LE(d, loss_tol) << parallel.loss[s] << " vs serial "
                           << serial.loss[s];
    EXPECT_EQ(parallel.steps[s].skipped, serial.steps[s].skipped);
    if (serial.steps[s].skipped) continue;
    EXPECT_LE(RelDiff(parallel.steps[s].grad_norm, serial.steps[s].grad_norm),
              norm_tol)
        << parallel.steps[s].grad_norm << " vs serial "
        << serial.steps[s].grad_norm;
  }
  return worst;
}

}  // namespace testing
}  // namespace optim
}  // namespace mcc
