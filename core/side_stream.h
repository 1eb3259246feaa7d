#ifndef CORE_SIDE_STREAM_H_
#define CORE_SIDE_STREAM_H_

// A second stream of work on a device, beside its current stream, for
// copies between device memory and pinned host memory that overlap compute
// (activation offloading, core/activation_offload.h), and the events that
// order the two streams.
//
// A device library registers SideStreamHooks for its device type (the CUDA
// runtime: a non-blocking cudaStream_t, cudaEvent_t, cudaMemcpyAsync). A
// type without hooks (the test device, or any device whose library
// registers none) gets a synchronous stand-in: copies go through the
// device's copy hook (CopyBytes, core/tensor.h) in program order, so they
// are done when they return, and events and waits are no-ops. The same
// calling code is correct under both.
//
// Ordering contract (as CUDA's): work on the side stream runs in the order
// it was issued there, unordered with the current stream except through
// events: SideStream::WaitForCurrentStream orders the side stream after
// the current stream's work issued so far; DeviceEvent::WaitOnCurrentStream
// orders the current stream's later work after the side stream's work
// recorded by the event. Memory a side-stream copy reads or writes must
// stay alive until an event recorded after the copy has been waited for.
//
// Thread-safety: registration is for static initialisation (or a test's
// setup, before any side stream exists); a SideStream and its events are
// used from one thread.

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"

namespace mcc {

struct SideStreamHooks {
  // A new stream on `device` that does not synchronise with the others;
  // null when none can be made.
  void* (*create_stream)(Device device) = nullptr;
  // Waits for the stream's work, then frees it.
  void (*destroy_stream)(Device device, void* stream) = nullptr;
  // A new event recorded on `stream` (null: the device's current stream).
  absl::Status (*record_event)(Device device, void* stream,
                               void** event) = nullptr;
  // Makes `stream` (null: the current stream) wait for `event` without
  // blocking the host.
  absl::Status (*wait_event)(Device device, void* event,
                             void* stream) = nullptr;
  // Blocks the host until `event` has completed.
  absl::Status (*synchronize_event)(Device device, void* event) = nullptr;
  void (*destroy_event)(Device device, void* event) = nullptr;
  // Copies `bytes` on `stream` between pinned host memory and `device`
  // memory (to_host: from the device), returning before the copy is done.
  absl::Status (*copy_async)(Device device, void* stream, void* dst,
                             const void* src, size_t bytes,
                             bool to_host) = nullptr;
};

// Sets the hooks of a non-CPU device type: all of them, or none ({}:
// the synchronous stand-in again, for tests). InvalidArgument otherwise.
absl::Status RegisterSideStreamHooks(DeviceType type, SideStreamHooks hooks);

// An event on a device (or the stand-in's no-op). Movable; destroying it
// is safe at any time.
class DeviceEvent {
 public:
  DeviceEvent() = default;
  DeviceEvent(DeviceEvent&& other) noexcept;
  DeviceEvent& operator=(DeviceEvent&& other) noexcept;
  ~DeviceEvent();

  // Orders the current stream's later work after the recorded work.
  absl::Status WaitOnCurrentStream() const;
  // Blocks the host until the recorded work is done.
  absl::Status Synchronize() const;

 private:
  friend class SideStream;
  DeviceEvent(const SideStreamHooks* hooks, Device device, void* event)
      : hooks_(hooks), device_(device), event_(event) {}
  const SideStreamHooks* hooks_ = nullptr;
  Device device_;
  void* event_ = nullptr;  // Null: nothing to wait for.
};

class SideStream {
 public:
  // A side stream on `device` (not the CPU: InvalidArgument, the host has
  // no streams). Devices without hooks get the synchronous stand-in.
  static absl::StatusOr<std::unique_ptr<SideStream>> Create(Device device);
  // Waits for the work issued on the stream, then frees it.
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  Device device() const { return device_; }
  // Whether copies really run beside the current stream (false: the
  // synchronous stand-in).
  bool asynchronous() const { return stream_ != nullptr; }

  // Orders the side stream's later work after the current stream's work
  // issued so far.
  absl::Status WaitForCurrentStream();
  // `bytes` from device memory to pinned host memory, and back, on the side
  // stream. Errors name the device, the direction and the size.
  absl::Status CopyToHost(void* pinned_dst, const void* device_src,
                          size_t bytes);
  absl::Status CopyToDevice(void* device_dst, const void* pinned_src,
                            size_t bytes);
  // An event after the side stream's work issued so far.
  absl::StatusOr<DeviceEvent> Record();
  // Blocks the host until the side stream's work is done.
  absl::Status Synchronize();

 private:
  SideStream(const SideStreamHooks* hooks, Device device, void* stream)
      : hooks_(hooks), device_(device), stream_(stream) {}
  // The hooks the stream was made with (tables are never freed, so a test
  // that registers others later does not pull them from under it).
  const SideStreamHooks* hooks_ = nullptr;
  Device device_;
  void* stream_ = nullptr;
};

}  // namespace mcc

#endif  // CORE_SIDE_STREAM_H_
