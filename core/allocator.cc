#include "core/allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <limits>
#include <mutex>

#include "absl/strings/str_format.h"
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

// Blocks up to this size come from the heap, not from fresh mappings.
constexpr int kHeapUpTo = 1 << 30;

class CpuAllocator : public Allocator {
 public:
  CpuAllocator() {
    // glibc maps every block above its mmap threshold (at most 32 MiB)
    // afresh and unmaps it on free, so the large activation buffers a
    // training step frees and takes again (the [tokens, vocabulary] logits
    // are 64 MiB at the bench preset) cost page faults on every step. Keep
    // them in the heap instead, and keep freed memory instead of trimming
    // it, as a caching allocator would (the counters below are unaffected).
    mallopt(M_MMAP_THRESHOLD, kHeapUpTo);
    // (The largest threshold mallopt's int takes; 2 * kHeapUpTo overflowed
    // to a negative int, which glibc read as an even larger unsigned one.)
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  }
  Device device() const override { return Device::CPU(); }

 protected:
  void* RawAllocate(size_t bytes) override {
    // aligned_alloc needs a size that is a multiple of the alignment.
    size_t rounded =
        (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded == 0) rounded = kCpuAlignment;
    return std::aligned_alloc(kCpuAlignment, rounded);
  }
  void RawFree(void* ptr, size_t) override { std::free(ptr); }
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
