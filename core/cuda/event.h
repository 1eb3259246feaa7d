#ifndef CORE_CUDA_EVENT_H_
#define CORE_CUDA_EVENT_H_

#include <cuda_runtime.h>

#include "absl/status/statusor.h"

namespace mcc {
namespace cuda {

// An owned CUDA event on one device, for timing and for ordering streams.
class Event {
 public:
  static absl::StatusOr<Event> Create(int device, bool timing = true);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  ~Event();

  // Records on `stream` (the device's current stream by default).
  absl::Status Record();
  absl::Status Record(cudaStream_t stream);
  // Makes `stream` wait for this event without blocking the host.
  absl::Status WaitOn(cudaStream_t stream) const;
  absl::Status Synchronize() const;
  // Milliseconds from `start` to this event; both must have completed
  // (Synchronize this one first) and have been created with timing.
  absl::StatusOr<float> ElapsedMsSince(const Event& start) const;

  cudaEvent_t get() const { return event_; }

 private:
  Event(int device, cudaEvent_t event) : device_(device), event_(event) {}
  int device_ = -1;
  cudaEvent_t event_ = nullptr;
};

}  // namespace cuda
}  // namespace mcc

#endif  // CORE_CUDA_EVENT_H_
