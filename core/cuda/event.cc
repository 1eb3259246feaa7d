#include "core/cuda/event.h"

#include <utility>

#include "core/cuda/cuda_status.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "glog/logging.h"

namespace mcc {
namespace cuda {

absl::StatusOr<Event> Event::Create(int device, bool timing) {
  if (absl::Status s = CheckDeviceIndex(device); !s.ok()) return s;
  DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  MCC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(
      &event, timing ? cudaEventDefault : cudaEventDisableTiming));
  return Event(device, event);
}

Event::Event(Event&& other) noexcept
    : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (event_ != nullptr) {
    const cudaError_t error = cudaEventDestroy(event_);
    LOG_IF(ERROR, error != cudaSuccess)
        << "cudaEventDestroy: " << cudaGetErrorString(error);
  }
}

absl::Status Event::Record() { return Record(CurrentStream(device_)); }

absl::Status Event::Record(cudaStream_t stream) {
  DeviceGuard guard(device_);
  MCC_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return absl::OkStatus();
}

absl::Status Event::WaitOn(cudaStream_t stream) const {
  MCC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, event_, 0));
  return absl::OkStatus();
}

absl::Status Event::Synchronize() const {
  MCC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

absl::StatusOr<float> Event::ElapsedMsSince(const Event& start) const {
  float ms = 0.0f;
  MCC_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

}  // namespace cuda
}  // namespace mcc
