#include "core/device_staging.h"

#include <atomic>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/tensor.h"
#include "glog/logging.h"

namespace mcc {
namespace {

// One slot per device type; each hook is read atomically so registration
// may race with use.
struct Slot {
  std::atomic<void* (*)(Device, size_t)> allocate_pinned{nullptr};
  std::atomic<void (*)(Device, void*)> free_pinned{nullptr};
  std::atomic<absl::Status (*)(void*, Device, const void*, size_t)> copy_async{
      nullptr};
  std::atomic<absl::Status (*)(Device)> synchronize{nullptr};
};

Slot& SlotOf(DeviceType type) {
  static Slot* slots = new Slot[kNumDeviceTypes];
  return slots[static_cast<int>(type)];
}

}  // namespace

void RegisterStagingHooks(DeviceType type, StagingHooks hooks) {
  CHECK(type != DeviceType::kCPU) << "the CPU needs no staging";
  Slot& slot = SlotOf(type);
  slot.allocate_pinned.store(hooks.allocate_pinned);
  slot.free_pinned.store(hooks.free_pinned);
  slot.copy_async.store(hooks.copy_async);
  slot.synchronize.store(hooks.synchronize);
}

void* AllocatePinnedHost(Device device, size_t bytes) {
  if (!device.is_cpu()) {
    if (auto* fn = SlotOf(device.type).allocate_pinned.load()) {
      return fn(device, bytes);
    }
  }
  size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  if (rounded == 0) rounded = kCpuAlignment;
  return std::aligned_alloc(kCpuAlignment, rounded);
}

void FreePinnedHost(Device device, void* ptr) {
  if (ptr == nullptr) return;
  if (!device.is_cpu()) {
    if (auto* fn = SlotOf(device.type).free_pinned.load()) {
      fn(device, ptr);
      return;
    }
  }
  std::free(ptr);
}

absl::Status CopyToDeviceAsync(void* dst, Device device, const void* pinned_src,
                               size_t bytes) {
  if (device.is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("asynchronous host-to-device copy of ", bytes,
                     " bytes to the CPU: the host needs no staging"));
  }
  if (bytes == 0) return absl::OkStatus();
  if (auto* fn = SlotOf(device.type).copy_async.load()) {
    return fn(dst, device, pinned_src, bytes);
  }
  return CopyBytes(dst, device, pinned_src, Device::CPU(), bytes);
}

absl::Status SynchronizeStream(Device device) {
  if (device.is_cpu()) return absl::OkStatus();
  if (auto* fn = SlotOf(device.type).synchronize.load()) return fn(device);
  return absl::OkStatus();
}

}  // namespace mcc
