#ifndef CORE_COMM_MP_TEST_UTIL_H_
#define CORE_COMM_MP_TEST_UTIL_H_

// Multi-process tests: the test binary re-executes itself, once per rank, in
// a worker mode chosen by the MCC_TEST_WORKER environment variable, with
// torchrun's variables set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port).

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace mcc {
namespace comm {
namespace testing {

struct WorkerResult {
  int rank = 0;
  // The exit code, or 128 + signal when killed by a signal.
  int exit_code = 0;
  bool timed_out = false;  // Killed by RunWorkers after the timeout.
  absl::Duration elapsed;  // From the start until this worker ended.
  std::string output;      // stdout and stderr together.
};

// Registers a worker body; it returns the process exit code.
bool RegisterWorker(const std::string& name, std::function<int()> fn);
#define MCC_WORKER(name)                                           \
  static int name##_worker();                                      \
  static const bool name##_registered =                            \
      ::mcc::comm::testing::RegisterWorker(#name, &name##_worker); \
  static int name##_worker()

// Runs `world_size` workers of the given name and waits for them all
// (killing them after `timeout`). extra_env(rank) adds variables per rank.
std::vector<WorkerResult> RunWorkers(
    int world_size, const std::string& name, absl::Duration timeout,
    const std::function<std::map<std::string, std::string>(int)>& extra_env =
        nullptr);

// For worker bodies: prints `what` and the status to stderr (where
// Describe shows it) and returns exit_code.
int ReportFailure(const std::string& what, const absl::Status& status,
                  int exit_code);

// All outputs, for failure messages.
std::string Describe(const std::vector<WorkerResult>& results);

// For main(): runs the worker named by MCC_TEST_WORKER and returns its exit
// code, or -1 when this process is not a worker.
int MaybeRunWorker(int argc, char** argv);

}  // namespace testing
}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_MP_TEST_UTIL_H_
