#ifndef CORE_CUDA_CUDA_ALLOCATOR_H_
#define CORE_CUDA_CUDA_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/allocator.h"

namespace mcc {
namespace cuda {

// Device memory for one GPU, from cudaMalloc, with a caching free list per
// size class so a training loop that frees and re-allocates the same shapes
// every step stops calling cudaMalloc after its first step. Sizes round up
// to a multiple of 512 bytes (up to 1 MiB) or of 1 MiB (above). Freed blocks
// are reused at once, without synchronisation: correct while all work runs
// on the device's current stream (see stream.h). On cudaMalloc failure the
// cache is released to the driver and the allocation retried once.
//
// Registered for DeviceType::kCUDA at static-initialisation time by this
// library (//core/cuda:runtime, alwayslink), so GetAllocator(cuda:i) finds
// it. Allocating on a device that does not exist dies with "no CUDA device:
// cannot allocate ..." (use cuda::EmptyOn for a Status instead).
class CudaAllocator : public Allocator {
 public:
  explicit CudaAllocator(int device_index);
  ~CudaAllocator() override;

  Device device() const override { return Device::CUDA(device_index_); }

  // Returns every cached (free) block to the driver.
  void EmptyCache();
  // Bytes held from cudaMalloc, in use or cached, and the cached part.
  int64_t ReservedBytes() const;
  int64_t CachedBytes() const;
  // Number of cudaMalloc calls made so far (what caching saves).
  int64_t CudaMallocCalls() const;

  static size_t RoundSize(size_t bytes);

 protected:
  void* RawAllocate(size_t bytes) override;
  void RawFree(void* ptr, size_t bytes) override;

 private:
  void EmptyCacheLocked();

  const int device_index_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_blocks_;  // size class -> blocks
  int64_t reserved_bytes_ = 0;
  int64_t cached_bytes_ = 0;
  int64_t malloc_calls_ = 0;
};

// The registered allocator of cuda:index (GetAllocator cast back).
CudaAllocator* GetCudaAllocator(int index);

}  // namespace cuda
}  // namespace mcc

#endif  // CORE_CUDA_CUDA_ALLOCATOR_H_
