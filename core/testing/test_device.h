#ifndef CORE_TESTING_TEST_DEVICE_H_
#define CORE_TESTING_TEST_DEVICE_H_

// A device for tests that is not the host (Device::TestDevice()).
//
// Its memory is host RAM, but tensors on it carry addresses the host cannot
// use: the allocator hands out the host address moved into the
// non-canonical part of the x86-64 address space, so a direct dereference
// faults at once, and Tensor::data<T>() dies with a message naming the
// tensor. Library code reaches the memory only as it would a GPU's:
//   - kernels: every dispatch slot runs its CPU kernel on host views
//     (core/ops/dispatch.h), unless a test registers another;
//   - the copy hook: Tensor::CopyFrom / To(Device) between it and the host;
//   - communication: the gloo process group works on its host views, as
//     NCCL works on device memory;
//   - graph capture (core/graph_capture.h): while a thread captures, its
//     kernel calls and device-to-device copies for the test device are
//     recorded with their arguments, not run (as CUDA runs nothing during
//     a capture), and Replay runs the list; host copies inside a capture
//     fail. So a graph whose caller forgot to copy an input into its static
//     buffer, or read a result before replaying, fails a test here.
// So a model that trains on the test device with the CPU's losses, bit for
// bit, runs no line of host code on device memory: what CI checks here, a
// GPU run only confirms.
//
// Linking this library (it is alwayslink) registers the device; nothing
// else is needed. Thread-safe.

#include <cstdint>

#include "core/device.h"
#include "core/tensor.h"

namespace mcc {
namespace testing {

// The offset between a test-device address and the host address of the
// same byte. Exposed for the test that checks it.
inline constexpr uintptr_t kTestDeviceAddressOffset = uintptr_t{1} << 62;

// Registers the test device's allocator, copier and host views (done at
// static initialisation; calling it again is harmless). Returns true.
bool RegisterTestDevice();

// Device-to-host and host-to-device copies made through the copy hook so
// far, for tests that bound the host synchronisations of a step.
int64_t TestDeviceCopiesToHost();
int64_t TestDeviceCopiesFromHost();
// Recorded calls (kernels and device copies) run by graph replays so far.
int64_t TestDeviceReplayedCalls();

}  // namespace testing
}  // namespace mcc

#endif  // CORE_TESTING_TEST_DEVICE_H_
