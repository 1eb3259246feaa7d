#include "core/cuda/cuda_allocator.h"

#include <cuda_runtime.h>

#include "core/cuda/cuda_status.h"
#include "core/cuda/runtime.h"
#include "glog/logging.h"

namespace mcc {
namespace cuda {

CudaAllocator::CudaAllocator(int device_index) : device_index_(device_index) {}

CudaAllocator::~CudaAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

size_t CudaAllocator::RoundSize(size_t bytes) {
  constexpr size_t kSmall = 512;
  constexpr size_t kLarge = size_t{1} << 20;
  if (bytes == 0) return kSmall;
  const size_t unit = bytes <= kLarge ? kSmall : kLarge;
  return (bytes + unit - 1) / unit * unit;
}

void* CudaAllocator::RawAllocate(size_t bytes) {
  const size_t rounded = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_blocks_.find(rounded);
  if (it != free_blocks_.end() && !it->second.empty()) {
    void* ptr = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= static_cast<int64_t>(rounded);
    return ptr;
  }
  if (!CheckDeviceIndex(device_index_).ok()) {
    LOG(FATAL) << "no CUDA device: cannot allocate " << FormatBytes(bytes)
               << " (" << bytes << " bytes) on cuda:" << device_index_ << " ("
               << CudaDeviceCount() << " CUDA devices present)";
  }
  DeviceGuard guard(device_index_);
  void* ptr = nullptr;
  cudaError_t error = cudaMalloc(&ptr, rounded);
  if (error == cudaErrorMemoryAllocation && cached_bytes_ > 0) {
    (void)cudaGetLastError();
    LOG(WARNING) << "cudaMalloc of " << FormatBytes(rounded)
                 << " on cuda:" << device_index_ << " failed; releasing "
                 << FormatBytes(cached_bytes_)
                 << " of cached blocks and retrying";
    EmptyCacheLocked();
    error = cudaMalloc(&ptr, rounded);
  }
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    LOG(ERROR)
        << CudaErrorToStatus(error, "cudaMalloc", __FILE__, __LINE__).message()
        << " for " << rounded << " bytes on cuda:" << device_index_;
    return nullptr;
  }
  ++malloc_calls_;
  reserved_bytes_ += static_cast<int64_t>(rounded);
  return ptr;
}

void CudaAllocator::RawFree(void* ptr, size_t bytes) {
  const size_t rounded = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  free_blocks_[rounded].push_back(ptr);
  cached_bytes_ += static_cast<int64_t>(rounded);
}

void CudaAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

void CudaAllocator::EmptyCacheLocked() {
  if (cached_bytes_ == 0) return;
  DeviceGuard guard(device_index_);
  for (auto& [size, blocks] : free_blocks_) {
    for (void* ptr : blocks) {
      const cudaError_t error = cudaFree(ptr);
      LOG_IF(ERROR, error != cudaSuccess)
          << "cudaFree on cuda:" << device_index_ << ": "
          << cudaGetErrorString(error);
      reserved_bytes_ -= static_cast<int64_t>(size);
    }
    blocks.clear();
  }
  free_blocks_.clear();
  cached_bytes_ = 0;
}

int64_t CudaAllocator::ReservedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_bytes_;
}

int64_t CudaAllocator::CachedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

int64_t CudaAllocator::CudaMallocCalls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return malloc_calls_;
}

CudaAllocator* GetCudaAllocator(int index) {
  return static_cast<CudaAllocator*>(GetAllocator(Device::CUDA(index)));
}

namespace {

// Allocators live for the whole process: tensors may be freed during static
// destruction, after any owner of these objects would have gone.
Allocator* MakeCudaAllocator(int index) { return new CudaAllocator(index); }

const bool registered = [] {
  RegisterAllocator(DeviceType::kCUDA, &MakeCudaAllocator);
  return true;
}();

}  // namespace

}  // namespace cuda
}  // namespace mcc
