#ifndef CORE_CUDA_STREAM_H_
#define CORE_CUDA_STREAM_H_

#include <cuda_runtime.h>

#include "absl/status/statusor.h"

namespace mcc {
namespace cuda {

// The stream that kernels, GEMMs and copies for a device are issued on by
// this thread. It is the legacy default stream (nullptr) unless a
// StreamGuard has set another one. The caching allocator reuses a freed
// block at once only on the stream it was allocated on; memory also used on
// another stream must be marked with RecordStream (cuda_allocator.h), and
// work on several streams ordered with events, as with PyTorch's.
cudaStream_t CurrentStream(int device);

// Sets this thread's current stream for `device` for the guard's scope.
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

// An owned non-blocking stream on one device.
class Stream {
 public:
  static absl::StatusOr<Stream> Create(int device);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  ~Stream();

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  absl::Status Synchronize() const;

 private:
  Stream(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
};

}  // namespace cuda
}  // namespace mcc

#endif  // CORE_CUDA_STREAM_H_
