#ifndef PARALLEL_TESTING_DEVICE_PARITY_H_
#define PARALLEL_TESTING_DEVICE_PARITY_H_

// What the multi-process "same bits on the CPU and on the test device"
// tests share (training/trainer_device_test, parallel/testing/
// device_training_test, models/gpt/gpt_trainer_device_test): each worker
// runs on the device MCC_TEST_DEVICE names, writes its results as lines of
// exact bit patterns, and the test compares the CPU's lines with the test
// device's. Test-only; not thread-safe (one worker per process).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/comm/init.h"
#include "core/device.h"
#include "core/tensor.h"
#include "parallel/parallel_state.h"

namespace mcc {
namespace parallel {
namespace testing {

// Exact text of a float or a double (hex of its bits).
std::string Bits(float v);
std::string Bits(double v);

// "cpu" is the CPU; anything else the test device.
Device ParityDevice(const std::string& name);

// The world of this worker process with every group moving `device`'s
// tensors (GroupOptions::device) and a 60 s collective timeout.
absl::StatusOr<comm::World> InitParityWorld(Device device);

// A parity worker's job: the world on `device` (InitParityWorld) and the
// parallel state of `sizes` over it. The world is kept because rank 0
// hosts the rendezvous store.
struct ParityJob {
  comm::World world;
  std::unique_ptr<ParallelState> state;
};
absl::StatusOr<ParityJob> InitParityJob(Device device, ParallelSizes sizes);

// `label` followed by the bits of every element of `t` (any floating dtype,
// any device: read through its copy hook), for exact comparison.
absl::StatusOr<std::string> BitsLine(const std::string& label, const Tensor& t);

// A file under the test's temporary directory ($TEST_TMPDIR, else /tmp).
std::string TmpPath(const std::string& name);
absl::Status WriteLines(const std::string& path,
                        const std::vector<std::string>& lines);
// The file's lines (none when it cannot be read).
std::vector<std::string> ReadLines(const std::string& path);

}  // namespace testing
}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_TESTING_DEVICE_PARITY_H_
