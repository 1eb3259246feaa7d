#ifndef CORE_ALLOCATOR_H_
#define CORE_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/device.h"

namespace mcc {

// Bytes held through one allocator: what the logs and the memory tests read.
struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t total_allocations = 0;
};

// Allocates device memory and counts it. Every Tensor's storage comes from
// the allocator of its device, so these counters are the per-rank memory use.
class Allocator {
 public:
  virtual ~Allocator() = default;

  // Returns nullptr when the memory cannot be had; Tensor turns that into an
  // error naming the size and the device.
  void* Allocate(size_t bytes);
  void Free(void* ptr, size_t bytes);

  virtual Device device() const = 0;

  MemoryStats Stats() const;
  // Sets the peak to the current use, so a test or a log can measure the
  // peak of one region.
  void ResetPeak();

 protected:
  virtual void* RawAllocate(size_t bytes) = 0;
  virtual void RawFree(void* ptr, size_t bytes) = 0;

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
};

// 64-byte aligned host memory (one cache line, one AVX-512 vector).
inline constexpr size_t kCpuAlignment = 64;

// The allocator for a device. CPU is always present; CUDA allocators are
// registered by the CUDA library when it is linked in, the test device's by
// //core/testing:test_device. Registration happens at static-initialisation
// time or before any tensor of that type exists.
Allocator* GetAllocator(Device device);
void RegisterAllocator(DeviceType type, Allocator* (*factory)(int index));

// Human-readable byte counts for logs: "1.50 GiB".
std::string FormatBytes(int64_t bytes);

}  // namespace mcc

#endif  // CORE_ALLOCATOR_H_
