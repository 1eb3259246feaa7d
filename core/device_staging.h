#ifndef CORE_DEVICE_STAGING_H_
#define CORE_DEVICE_STAGING_H_

// Host-to-device staging that does not block the host: pinned
// (page-locked) host memory a device can read asynchronously, and a copy
// from it issued on the device's current stream. PinnedStagingPool
// (core/pinned_staging_pool.h) builds on it.
//
// A device library registers StagingHooks for its device type (the CUDA
// runtime: cudaHostAlloc, cudaMemcpyAsync on the current stream, and a
// synchronisation of that stream). A type without hooks (the CPU, the test
// device) gets 64-byte-aligned host memory, a copy through the device's
// copy hook (CopyBytes, core/tensor.h: synchronous, so the host buffer is
// free again when it returns; the test device counts it) and a no-op
// synchronisation.
//
// Contract of CopyToDeviceAsync: the copy is ordered on the device's
// current stream after the work issued before it, and later work on that
// stream may use the destination at once. It may return before the copy is
// done, so `pinned_src` must stay alive and unmodified until the stream has
// passed the copy: until SynchronizeStream(device) returns, or until a
// later blocking device-to-host copy on the same stream (the trainer's one
// read per step) has returned. Errors name the device and the size.
//
// Thread-safety: registration is for static initialisation; the other
// calls may come from any thread (the stream is the calling thread's).

#include <cstddef>

#include "absl/status/status.h"
#include "core/device.h"

namespace mcc {

struct StagingHooks {
  // Page-locked host memory for the device (null when none can be had),
  // and its release.
  void* (*allocate_pinned)(Device device, size_t bytes) = nullptr;
  void (*free_pinned)(Device device, void* ptr) = nullptr;
  // See CopyToDeviceAsync.
  absl::Status (*copy_async)(void* dst, Device device, const void* pinned_src,
                             size_t bytes) = nullptr;
  // Returns once the device's current stream has finished its work.
  absl::Status (*synchronize)(Device device) = nullptr;
};

// Sets the hooks of a non-CPU device type; hooks left null keep the
// default behaviour described above. Registering {} restores the defaults
// (for tests).
void RegisterStagingHooks(DeviceType type, StagingHooks hooks);

// Pinned host memory for staging to `device` (null when it cannot be had);
// free it with FreePinnedHost on the same device.
void* AllocatePinnedHost(Device device, size_t bytes);
void FreePinnedHost(Device device, void* ptr);

// Copies `bytes` from pinned host memory to `dst` on `device` (not the
// CPU: InvalidArgument) on the device's current stream (see the contract
// above).
absl::Status CopyToDeviceAsync(void* dst, Device device, const void* pinned_src,
                               size_t bytes);

// Waits until the device's current stream has done its work (nothing on
// the CPU).
absl::Status SynchronizeStream(Device device);

}  // namespace mcc

#endif  // CORE_DEVICE_STAGING_H_
