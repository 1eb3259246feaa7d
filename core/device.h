#ifndef CORE_DEVICE_H_
#define CORE_DEVICE_H_

#include <string>

namespace mcc {

// kTestDevice is a device for tests that is not the host: its memory lives
// in host RAM, but library code may reach it only through kernels and the
// copy hook (//core/testing:test_device), so CI runs every non-kernel line of
// the device path without a GPU.
enum class DeviceType : int { kCPU = 0, kCUDA = 1, kTestDevice = 2 };
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device CPU() { return Device{DeviceType::kCPU, 0}; }
  static Device CUDA(int index) { return Device{DeviceType::kCUDA, index}; }
  static Device TestDevice(int index = 0) {
    return Device{DeviceType::kTestDevice, index};
  }

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string ToString() const;  // "cpu", "cuda:1", "testdev:0"

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

}  // namespace mcc

#endif  // CORE_DEVICE_H_
