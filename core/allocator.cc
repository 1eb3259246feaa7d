#include "core/allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <limits>
#include <mutex>

#include "absl/strings/str_format.h"
#include "core/host_block_cache.h"
#include "glog/logging.h"

namespace mcc {

void* Allocator::Allocate(size_t bytes) {
  void* ptr = RawAllocate(bytes);
  if (ptr == nullptr) return nullptr;
  const int64_t now = current_.fetch_add(bytes) + static_cast<int64_t>(bytes);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  allocations_.fetch_add(1);
  return ptr;
}

void Allocator::Free(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  RawFree(ptr, bytes);
  current_.fetch_sub(bytes);
}

MemoryStats Allocator::Stats() const {
  MemoryStats stats;
  stats.current_bytes = current_.load();
  stats.peak_bytes = peak_.load();
  stats.total_allocations = allocations_.load();
  return stats;
}

void Allocator::ResetPeak() { peak_.store(current_.load()); }

namespace {

// glibc's ceiling for M_MMAP_THRESHOLD on 64-bit (HEAP_MAX_SIZE / 2); a
// larger value is refused.
constexpr int kGlibcMmapThresholdMax = 32 << 20;

class CpuAllocator : public Allocator {
 public:
  CpuAllocator() : large_(HostBlockCache::DefaultMaxCachedBytes()) {
    // Blocks under 128 KiB come from glibc's heap; keep freed heap memory
    // instead of trimming it (larger ones never reach the heap: see below).
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
    // Setting the trim threshold also freezes glibc's mmap threshold at its
    // 128 KiB start (no dynamic raising), so every other buffer of 128 KiB
    // and more (std::vector scratch, gloo's buffers) would be mapped and
    // unmapped, and re-faulted, on each use; tensors of that size go to the
    // block cache below.
    mallopt(M_MMAP_THRESHOLD, kGlibcMmapThresholdMax);
  }
  Device device() const override { return Device::CPU(); }

 protected:
  // Blocks from HostBlockCache::kMinBlockBytes (128 KiB) up (activations,
  // logits, their gradients, kernels' scratch) go through a cache that
  // keeps them mapped once freed: glibc unmaps the largest (its mmap
  // threshold caps at 32 MiB) and gives medium ones fresh addresses often
  // enough that every step paid a page fault per 4 KiB page of them again
  // (core/host_block_cache.h).
  void* RawAllocate(size_t bytes) override {
    if (bytes >= HostBlockCache::kMinBlockBytes) return large_.Allocate(bytes);
    // aligned_alloc needs a size that is a multiple of the alignment.
    size_t rounded =
        (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded == 0) rounded = kCpuAlignment;
    return std::aligned_alloc(kCpuAlignment, rounded);
  }
  void RawFree(void* ptr, size_t bytes) override {
    if (bytes >= HostBlockCache::kMinBlockBytes) {
      large_.Free(ptr);
    } else {
      std::free(ptr);
    }
  }

 private:
  HostBlockCache large_;
};

constexpr int kMaxDevices = 64;

struct Registry {
  std::mutex mu;
  Allocator* (*factory[kNumDeviceTypes])(int) = {};
  Allocator* allocators[kNumDeviceTypes][kMaxDevices] = {};
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

Allocator* GetAllocator(Device device) {
  if (device.is_cpu()) {
    static Allocator* cpu = new CpuAllocator;
    return cpu;
  }
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  CHECK(device.index >= 0 && device.index < kMaxDevices)
      << "device index out of range: " << device.ToString();
  const int type = static_cast<int>(device.type);
  CHECK(type >= 0 && type < kNumDeviceTypes) << "unknown device type " << type;
  CHECK(registry.factory[type] != nullptr)
      << "no allocator for " << device.ToString() << ": link "
      << (device.is_cuda() ? "//core/cuda:runtime to use CUDA tensors"
                           : "//core/testing:test_device in tests");
  Allocator*& slot = registry.allocators[type][device.index];
  if (slot == nullptr) slot = registry.factory[type](device.index);
  return slot;
}

void RegisterAllocator(DeviceType type, Allocator* (*factory)(int index)) {
  CHECK(type != DeviceType::kCPU) << "the CPU allocator is built in";
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.factory[static_cast<int>(type)] = factory;
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30))
    return absl::StrFormat("%.2f GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20))
    return absl::StrFormat("%.2f MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10))
    return absl::StrFormat("%.2f KiB", b / (1 << 10));
  return absl::StrFormat("%d B", bytes);
}

}  // namespace mcc
