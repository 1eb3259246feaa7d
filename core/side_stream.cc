#include "core/side_stream.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace mcc {
namespace {

// One table per device type; null: no hooks (the synchronous stand-in).
// Replaced tables are leaked: a stream made before a test re-registers may
// still read the old one.
std::atomic<const SideStreamHooks*>& SlotOf(DeviceType type) {
  static auto* slots = [] {
    auto* s = new std::atomic<const SideStreamHooks*>[kNumDeviceTypes];
    // A default-constructed atomic holds no value before C++20.
    for (int i = 0; i < kNumDeviceTypes; ++i) s[i].store(nullptr);
    return s;
  }();
  return slots[static_cast<int>(type)];
}

const SideStreamHooks* HooksOf(Device device) {
  if (device.is_cpu()) return nullptr;
  return SlotOf(device.type).load();
}

}  // namespace

absl::Status RegisterSideStreamHooks(DeviceType type, SideStreamHooks hooks) {
  if (type == DeviceType::kCPU) {
    return absl::InvalidArgumentError("the CPU has no side streams");
  }
  const int set =
      (hooks.create_stream != nullptr) + (hooks.destroy_stream != nullptr) +
      (hooks.record_event != nullptr) + (hooks.wait_event != nullptr) +
      (hooks.synchronize_event != nullptr) + (hooks.destroy_event != nullptr) +
      (hooks.copy_async != nullptr);
  if (set != 0 && set != 7) {
    return absl::InvalidArgumentError(
        absl::StrCat("side-stream hooks for ", Device{type, 0}.ToString(), ": ",
                     set, " of 7 set; give all of them or none"));
  }
  SlotOf(type).store(set == 0 ? nullptr : new SideStreamHooks(hooks));
  return absl::OkStatus();
}

DeviceEvent::DeviceEvent(DeviceEvent&& other) noexcept
    : hooks_(other.hooks_),
      device_(other.device_),
      event_(std::exchange(other.event_, nullptr)) {}

DeviceEvent& DeviceEvent::operator=(DeviceEvent&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) hooks_->destroy_event(device_, event_);
    hooks_ = other.hooks_;
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

DeviceEvent::~DeviceEvent() {
  if (event_ != nullptr) hooks_->destroy_event(device_, event_);
}

absl::Status DeviceEvent::WaitOnCurrentStream() const {
  if (event_ == nullptr) return absl::OkStatus();
  return hooks_->wait_event(device_, event_, nullptr);
}

absl::Status DeviceEvent::Synchronize() const {
  if (event_ == nullptr) return absl::OkStatus();
  return hooks_->synchronize_event(device_, event_);
}

absl::StatusOr<std::unique_ptr<SideStream>> SideStream::Create(Device device) {
  if (device.is_cpu()) {
    return absl::InvalidArgumentError(
        "side stream on the CPU: the host has no device streams");
  }
  const SideStreamHooks* hooks = HooksOf(device);
  void* stream = nullptr;
  if (hooks != nullptr) {
    stream = hooks->create_stream(device);
    if (stream == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot create a side stream on ", device.ToString()));
    }
  }
  return std::unique_ptr<SideStream>(new SideStream(hooks, device, stream));
}

SideStream::~SideStream() {
  if (stream_ != nullptr) hooks_->destroy_stream(device_, stream_);
}

absl::Status SideStream::WaitForCurrentStream() {
  if (stream_ == nullptr) return absl::OkStatus();
  void* event = nullptr;
  absl::Status s = hooks_->record_event(device_, nullptr, &event);
  if (s.ok()) s = hooks_->wait_event(device_, event, stream_);
  if (event != nullptr) hooks_->destroy_event(device_, event);
  return s;
}

absl::Status SideStream::CopyToHost(void* pinned_dst, const void* device_src,
                                    size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const absl::Status s =
      stream_ == nullptr
          ? CopyBytes(pinned_dst, Device::CPU(), device_src, device_, bytes)
          : hooks_->copy_async(device_, stream_, pinned_dst, device_src, bytes,
                               /*to_host=*/true);
  if (s.ok()) return s;
  return absl::Status(
      s.code(), absl::StrCat("side-stream copy of ", bytes, " bytes from ",
                             device_.ToString(),
                             " to pinned host memory: ", s.message()));
}

absl::Status SideStream::CopyToDevice(void* device_dst, const void* pinned_src,
                                      size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const absl::Status s =
      stream_ == nullptr
          ? CopyBytes(device_dst, device_, pinned_src, Device::CPU(), bytes)
          : hooks_->copy_async(device_, stream_, device_dst, pinned_src, bytes,
                               /*to_host=*/false);
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      absl::StrCat("side-stream copy of ", bytes,
                                   " bytes from pinned host memory to ",
                                   device_.ToString(), ": ", s.message()));
}

absl::StatusOr<DeviceEvent> SideStream::Record() {
  if (stream_ == nullptr) return DeviceEvent();
  void* event = nullptr;
  MCC_RETURN_IF_ERROR(hooks_->record_event(device_, stream_, &event));
  return DeviceEvent(hooks_, device_, event);
}

absl::Status SideStream::Synchronize() {
  if (stream_ == nullptr) return absl::OkStatus();
  MCC_ASSIGN_OR_RETURN(DeviceEvent event, Record());
  return event.Synchronize();
}

}  // namespace mcc
