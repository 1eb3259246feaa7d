#ifndef CORE_PINNED_STAGING_POOL_H_
#define CORE_PINNED_STAGING_POOL_H_

// Reusable pinned host buffers through which host tensors (a step's
// micro-batches from the data loader) go to a device without blocking the
// host: each Stage copies a host tensor into a pinned buffer and issues an
// asynchronous copy from it on the device's current stream
// (core/device_staging.h). A buffer stays "in flight" until Recycle, which
// waits for the stream once and makes every buffer reusable, so the pool
// allocates pinned memory only until it holds a step's worth.
//
// Ownership: the pool owns its pinned buffers; staged tensors are ordinary
// device tensors that own their memory. Destroying the pool waits for
// copies in flight first.
//
// Thread-safety: none; one thread stages, recycles and destroys.
//
// Errors: Stage of an undefined or non-CPU tensor is InvalidArgument, a
// failed pinned allocation ResourceExhausted, a failed copy the device's
// error; the pool stays usable after any of them.

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/tensor.h"

namespace mcc {

class PinnedStagingPool {
 public:
  // Stages to `device` (the CPU: Stage hands tensors back as they are).
  explicit PinnedStagingPool(Device device);
  ~PinnedStagingPool();
  PinnedStagingPool(const PinnedStagingPool&) = delete;
  PinnedStagingPool& operator=(const PinnedStagingPool&) = delete;

  Device device() const { return device_; }

  // A new tensor on device() with the values of `host` (a CPU tensor),
  // ordered on the device's current stream: later work on that stream may
  // use it at once. `host` may be changed or freed as soon as Stage
  // returns; the pinned copy stays in flight until Recycle. On the CPU,
  // returns `host` itself (no copy).
  absl::StatusOr<Tensor> Stage(const Tensor& host);

  // Waits for the device's current stream (once, and only when something
  // is in flight), then makes every buffer reusable.
  absl::Status Recycle();

  // Pinned buffers held (free and in flight), their bytes, and those in
  // flight.
  int num_buffers() const {
    return static_cast<int>(free_.size() + in_flight_.size());
  }
  size_t pinned_bytes() const { return pinned_bytes_; }
  int num_in_flight() const { return static_cast<int>(in_flight_.size()); }

 private:
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  // The smallest free buffer of at least `bytes`, or a new one.
  absl::StatusOr<Buffer> Take(size_t bytes);

  Device device_;
  std::vector<Buffer> free_;
  std::vector<Buffer> in_flight_;
  size_t pinned_bytes_ = 0;
};

}  // namespace mcc

#endif  // CORE_PINNED_STAGING_POOL_H_
