#include "core/testing/test_device.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"

namespace mcc {
namespace testing {
namespace {

std::atomic<int64_t> g_to_host{0};
std::atomic<int64_t> g_from_host{0};

void* ToDeviceAddress(void* host) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(host) +
                                 kTestDeviceAddressOffset);
}

void* ToHostAddress(const void* device) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(device) -
                                 kTestDeviceAddressOffset);
}

class TestDeviceAllocator : public Allocator {
 public:
  explicit TestDeviceAllocator(int index) : index_(index) {}
  Device device() const override { return Device::TestDevice(index_); }

 protected:
  void* RawAllocate(size_t bytes) override {
    size_t rounded =
        (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded == 0) rounded = kCpuAlignment;
    void* host = std::aligned_alloc(kCpuAlignment, rounded);
    return host == nullptr ? nullptr : ToDeviceAddress(host);
  }
  void RawFree(void* ptr, size_t) override {
    if (ptr != nullptr) std::free(ToHostAddress(ptr));
  }

 private:
  int index_;
};

absl::Status Copy(void* dst, Device dst_device, const void* src,
                  Device src_device, size_t bytes) {
  for (const Device& d : {dst_device, src_device}) {
    if (!d.is_cpu() && d.type != DeviceType::kTestDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "test-device copier asked to copy ", bytes, " bytes from ",
          src_device.ToString(), " to ", dst_device.ToString()));
    }
  }
  void* host_dst = dst_device.is_cpu() ? dst : ToHostAddress(dst);
  const void* host_src = src_device.is_cpu() ? src : ToHostAddress(src);
  if (dst_device.is_cpu()) g_to_host.fetch_add(1);
  if (src_device.is_cpu()) g_from_host.fetch_add(1);
  std::memmove(host_dst, host_src, bytes);
  return absl::OkStatus();
}

}  // namespace

bool RegisterTestDevice() {
  static const bool registered = [] {
    RegisterAllocator(DeviceType::kTestDevice, [](int index) -> Allocator* {
      return new TestDeviceAllocator(index);
    });
    RegisterDeviceCopy(DeviceType::kTestDevice, &Copy);
    RegisterHostBackedDevice(DeviceType::kTestDevice, &ToHostAddress);
    return true;
  }();
  return registered;
}

int64_t TestDeviceCopiesToHost() { return g_to_host.load(); }
int64_t TestDeviceCopiesFromHost() { return g_from_host.load(); }

namespace {
const bool kRegistered = RegisterTestDevice();
}  // namespace

}  // namespace testing
}  // namespace mcc
