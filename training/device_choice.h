#ifndef TRAINING_DEVICE_CHOICE_H_
#define TRAINING_DEVICE_CHOICE_H_

// What --device (tools/flags/device_flag.h) means for train and eval: where
// the model's parameters, the optimizer state, the batches and the loss
// live. cpu, cuda, or auto (cuda when a GPU is present, else cpu). Under
// tools/launch each process takes the GPU its LOCAL_RANK picks:
// cuda:(LOCAL_RANK % device count). A build that links
// //core/testing:test_device also accepts `test` (the test device: CPU
// kernels behind a GPU's wall), for the end-to-end tests; the user binaries
// do not.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"

namespace mcc {
namespace training {

struct DeviceChoice {
  Device device;
  // Why, for the log: "--device auto: 8 CUDA devices present; LOCAL_RANK 3
  // picks cuda:3 (NVIDIA H200 ...)".
  std::string reason;
};

// A --device value checked before any process group forms: an error naming
// --device for an unknown value, or for cuda without a GPU.
absl::Status CheckDevice(const std::string& value);

// This process's device by the --device value and LOCAL_RANK (0 without a
// launcher). The errors of CheckDevice, and one for more local processes
// than GPUs (NCCL needs a GPU per process).
absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& value);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_DEVICE_CHOICE_H_
