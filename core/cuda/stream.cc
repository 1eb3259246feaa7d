#include "core/cuda/stream.h"

#include <utility>

#include "core/cuda/cuda_status.h"
#include "core/cuda/runtime.h"
#include "glog/logging.h"

namespace mcc {
namespace cuda {
namespace {

constexpr int kMaxDevices = 64;
thread_local cudaStream_t current_streams[kMaxDevices] = {};

}  // namespace

cudaStream_t CurrentStream(int device) {
  CHECK(device >= 0 && device < kMaxDevices) << "bad CUDA device " << device;
  return current_streams[device];
}

StreamGuard::StreamGuard(int device, cudaStream_t stream)
    : device_(device), previous_(CurrentStream(device)) {
  current_streams[device] = stream;
}

StreamGuard::~StreamGuard() { current_streams[device_] = previous_; }

absl::StatusOr<Stream> Stream::Create(int device) {
  if (absl::Status s = CheckDeviceIndex(device); !s.ok()) return s;
  DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  MCC_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return Stream(device, stream);
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_), stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    device_ = other.device_;
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (stream_ != nullptr) {
    DeviceGuard guard(device_);
    const cudaError_t error = cudaStreamDestroy(stream_);
    LOG_IF(ERROR, error != cudaSuccess)
        << "cudaStreamDestroy: " << cudaGetErrorString(error);
  }
}

absl::Status Stream::Synchronize() const {
  MCC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace mcc
