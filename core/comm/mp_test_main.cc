// main() for multi-process tests: a worker when MCC_TEST_WORKER is set,
// else the GoogleTest runner.
#include "core/comm/mp_test_util.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  // A worker that crashes prints where (its stderr reaches the test's
  // report), then dies of the same signal, so its exit status is unchanged.
  google::InstallFailureSignalHandler();
  const int code = mcc::comm::testing::MaybeRunWorker(argc, argv);
  if (code >= 0) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
