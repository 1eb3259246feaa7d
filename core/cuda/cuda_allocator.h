#ifndef CORE_CUDA_CUDA_ALLOCATOR_H_
#define CORE_CUDA_CUDA_ALLOCATOR_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/allocator.h"
#include "core/tensor.h"

namespace mcc {
namespace cuda {

// Device memory for one GPU, from cudaMalloc, with a caching free list per
// stream and size class so a training loop that frees and re-allocates the
// same shapes every step stops calling cudaMalloc after its first step.
// Sizes round up to a multiple of 512 bytes (up to 1 MiB) or of 1 MiB
// (above).
//
// Stream-aware, as PyTorch's caching allocator: a block belongs to the
// stream that was current (stream.h) when it was allocated, and once freed
// it is reused at once, without synchronisation, but only by allocations on
// that stream (whose later work runs after the work that used it). A block
// also used on other streams is marked with RecordStream; when it is freed,
// an event is recorded on each of those streams and the block is reused
// only once all have completed. On cudaMalloc failure the pending blocks
// are waited for, the cache is released to the driver and the allocation
// retried once.
//
// Registered for DeviceType::kCUDA at static-initialisation time by this
// library (//core/cuda:runtime, alwayslink), so GetAllocator(cuda:i) finds
// it. Allocating on a device that does not exist dies with "no CUDA device:
// cannot allocate ..." (use cuda::EmptyOn for a Status instead).
// Thread-safe; a block may be freed on any thread.
class CudaAllocator : public Allocator {
 public:
  explicit CudaAllocator(int device_index);
  ~CudaAllocator() override;

  Device device() const override { return Device::CUDA(device_index_); }

  // Marks the block holding `ptr` (any address inside memory from this
  // allocator) as used on `stream` too (torch's Tensor.record_stream).
  // InvalidArgument when no live block holds ptr.
  absl::Status RecordStream(const void* ptr, cudaStream_t stream);

  // Returns every cached (free) block to the driver, after waiting for the
  // blocks whose other streams had not finished.
  void EmptyCache();
  // Bytes held from cudaMalloc, in use or cached, and the cached part.
  int64_t ReservedBytes() const;
  int64_t CachedBytes() const;
  // Freed blocks waiting for other streams before they can be reused.
  int64_t PendingBytes() const;
  // Number of cudaMalloc calls made so far (what caching saves).
  int64_t CudaMallocCalls() const;

  static size_t RoundSize(size_t bytes);

  // Private pools for graph captures (core/cuda/graph_capture.cc). Between
  // BeginCapturePool and EndCapturePool, the calling thread's allocations
  // come from a new pool (by cudaMalloc, or a block freed earlier in the
  // same pool: reuse inside a capture follows the captured stream order),
  // never from the shared cache, and the pool's blocks never go to the
  // shared cache: they stay reserved until ReleasePool, so a captured graph
  // finds its memory at the same addresses on every replay. No event query
  // or cudaFree happens while a pool is active (both are illegal inside a
  // capture). ReleasePool frees the pool's free blocks (cudaFree, which
  // waits for the device) and the rest when they are freed. One active pool
  // per thread.
  int BeginCapturePool();
  void EndCapturePool();
  void ReleasePool(int pool);
  // Bytes reserved by live pools (in use or free within them).
  int64_t PoolBytes() const;

 protected:
  void* RawAllocate(size_t bytes) override;
  void RawFree(void* ptr, size_t bytes) override;

 private:
  struct Block {
    size_t size = 0;
    cudaStream_t stream = nullptr;     // Allocated on (owns the reuse).
    std::vector<cudaStream_t> others;  // Also used on (RecordStream).
    int pool = 0;                      // Capture pool; 0: the shared cache.
  };
  struct Pool {
    std::map<size_t, std::vector<void*>> free;  // By rounded size.
    int64_t bytes = 0;                          // Reserved by the pool.
  };
  struct PendingFree {
    void* ptr = nullptr;
    Block block;
    std::vector<cudaEvent_t> events;  // One per other stream.
  };
  using FreeKey = std::pair<cudaStream_t, size_t>;

  // Moves pending blocks whose events have completed to the free lists
  // (all of them, waiting, when `wait`).
  void ProcessPendingLocked(bool wait);
  void EmptyCacheLocked();
  void* AllocateFromPoolLocked(int pool, size_t rounded, cudaStream_t stream);
  cudaEvent_t TakeEventLocked();

  const int device_index_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Block> live_;                    // By start address.
  std::map<FreeKey, std::vector<void*>> free_blocks_;  // Reusable now.
  std::deque<PendingFree> pending_;
  std::vector<cudaEvent_t> spare_events_;
  std::map<int, Pool> pools_;  // Live (not released) capture pools.
  int next_pool_ = 1;
  int64_t reserved_bytes_ = 0;
  int64_t cached_bytes_ = 0;
  int64_t pending_bytes_ = 0;
  int64_t malloc_calls_ = 0;
};

// The registered allocator of cuda:index (GetAllocator cast back).
CudaAllocator* GetCudaAllocator(int index);

// RecordStream for a CUDA tensor's memory (no-op for an empty tensor);
// InvalidArgument for a tensor not on a CUDA device.
absl::Status RecordStream(const Tensor& t, cudaStream_t stream);

}  // namespace cuda
}  // namespace mcc

#endif  // CORE_CUDA_CUDA_ALLOCATOR_H_
