#include "core/cuda/cuda_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "glog/logging.h"

namespace mcc {
namespace cuda {
namespace {
// The capture pool this thread allocates from, per allocator.
thread_local std::map<const CudaAllocator*, int> t_capture_pool;

// Sets this thread's stream-capture mode for its scope
// (cudaThreadExchangeStreamCaptureMode), restoring the previous one after.
class CaptureModeGuard {
 public:
  explicit CaptureModeGuard(cudaStreamCaptureMode mode) : mode_(mode) {
    MCC_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_));
  }
  ~CaptureModeGuard() {
    MCC_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_));
  }
  CaptureModeGuard(const CaptureModeGuard&) = delete;
  CaptureModeGuard& operator=(const CaptureModeGuard&) = delete;

 private:
  cudaStreamCaptureMode mode_;  // The other mode: the one to swap back in.
};
}  // namespace

CudaAllocator::CudaAllocator(int device_index) : device_index_(device_index) {}

CudaAllocator::~CudaAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
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
  if (!CheckDeviceIndex(device_index_).ok()) {
    LOG(FATAL) << "no CUDA device: cannot allocate " << FormatBytes(bytes)
               << " (" << bytes << " bytes) on cuda:" << device_index_ << " ("
               << CudaDeviceCount() << " CUDA devices present)";
  }
  const cudaStream_t stream = CurrentStream(device_index_);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto pool = t_capture_pool.find(this); pool != t_capture_pool.end()) {
    return AllocateFromPoolLocked(pool->second, rounded, stream);
  }
  if (!pending_.empty()) ProcessPendingLocked(/*wait=*/false);
  auto it = free_blocks_.find({stream, rounded});
  if (it != free_blocks_.end() && !it->second.empty()) {
    void* ptr = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= static_cast<int64_t>(rounded);
    live_[reinterpret_cast<uintptr_t>(ptr)] = {rounded, stream, {}};
    return ptr;
  }
  DeviceGuard guard(device_index_);
  void* ptr = nullptr;
  cudaError_t error = cudaMalloc(&ptr, rounded);
  if (error == cudaErrorMemoryAllocation &&
      (cached_bytes_ > 0 || pending_bytes_ > 0)) {
    (void)cudaGetLastError();
    LOG(WARNING) << "cudaMalloc of " << FormatBytes(rounded)
                 << " on cuda:" << device_index_ << " failed; releasing "
                 << FormatBytes(cached_bytes_ + pending_bytes_)
                 << " of cached blocks and retrying";
    EmptyCacheLocked();
    error = cudaMalloc(&ptr, rounded);
  }
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    // Only a true out-of-memory may reach Storage's "out of memory" death.
    LOG_IF(FATAL, error != cudaErrorMemoryAllocation)
        << CudaErrorToStatus(error, "cudaMalloc", __FILE__, __LINE__).message()
        << " for " << rounded << " bytes on cuda:" << device_index_
        << ": not an out-of-memory";
    LOG(ERROR)
        << CudaErrorToStatus(error, "cudaMalloc", __FILE__, __LINE__).message()
        << " for " << rounded << " bytes on cuda:" << device_index_;
    return nullptr;
  }
  ++malloc_calls_;
  reserved_bytes_ += static_cast<int64_t>(rounded);
  live_[reinterpret_cast<uintptr_t>(ptr)] = {rounded, stream, {}};
  return ptr;
}

cudaEvent_t CudaAllocator::TakeEventLocked() {
  if (!spare_events_.empty()) {
    cudaEvent_t e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  DeviceGuard guard(device_index_);
  cudaEvent_t e = nullptr;
  const cudaError_t error =
      cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    LOG(ERROR) << "cudaEventCreate on cuda:" << device_index_ << ": "
               << cudaGetErrorString(error);
    return nullptr;
  }
  return e;
}

void CudaAllocator::RawFree(void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  CHECK(it != live_.end()) << "CudaAllocator: freeing " << ptr << " (" << bytes
                           << " bytes) that cuda:" << device_index_
                           << " did not allocate";
  Block block = std::move(it->second);
  live_.erase(it);
  if (block.pool != 0) {
    // Back to its pool (never the shared cache), or to the driver once the
    // pool is released.
    auto pool = pools_.find(block.pool);
    if (pool != pools_.end()) {
      pool->second.free[block.size].push_back(ptr);
      return;
    }
    DeviceGuard guard(device_index_);
    const cudaError_t error = cudaFree(ptr);
    LOG_IF(ERROR, error != cudaSuccess) << "cudaFree on cuda:" << device_index_
                                        << ": " << cudaGetErrorString(error);
    reserved_bytes_ -= static_cast<int64_t>(block.size);
    return;
  }
  if (block.others.empty()) {
    free_blocks_[{block.stream, block.size}].push_back(ptr);
    cached_bytes_ += static_cast<int64_t>(block.size);
    return;
  }
  // Reusable once the other streams have done what was queued on them.
  PendingFree pending;
  pending.ptr = ptr;
  for (cudaStream_t s : block.others) {
    cudaEvent_t e = TakeEventLocked();
    cudaError_t error = e != nullptr ? cudaEventRecord(e, s) : cudaErrorUnknown;
    if (error != cudaSuccess) {
      // Without an event, wait for the stream here: slower, still safe.
      (void)cudaGetLastError();
      LOG(ERROR) << "CudaAllocator: recording an event on a stream of cuda:"
                 << device_index_ << " failed (" << cudaGetErrorString(error)
                 << "); synchronising the stream instead";
      if (e != nullptr) spare_events_.push_back(e);
      cudaStreamSynchronize(s);
      continue;
    }
    pending.events.push_back(e);
  }
  pending.block = std::move(block);
  pending_bytes_ += static_cast<int64_t>(pending.block.size);
  pending_.push_back(std::move(pending));
}

void CudaAllocator::ProcessPendingLocked(bool wait) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    bool ready = true;
    for (cudaEvent_t e : it->events) {
      cudaError_t q = wait ? cudaEventSynchronize(e) : cudaEventQuery(e);
      if (q == cudaErrorNotReady) {
        ready = false;
        break;
      }
      if (q != cudaSuccess) {
        (void)cudaGetLastError();
        LOG(ERROR) << "CudaAllocator: waiting for a stream of cuda:"
                   << device_index_ << ": " << cudaGetErrorString(q);
      }
    }
    if (!ready) {
      ++it;
      continue;
    }
    for (cudaEvent_t e : it->events) spare_events_.push_back(e);
    const size_t size = it->block.size;
    free_blocks_[{it->block.stream, size}].push_back(it->ptr);
    cached_bytes_ += static_cast<int64_t>(size);
    pending_bytes_ -= static_cast<int64_t>(size);
    it = pending_.erase(it);
  }
}

absl::Status CudaAllocator::RecordStream(const void* ptr, cudaStream_t stream) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(p);
  if (it == live_.begin() || (--it, p >= it->first + it->second.size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordStream: ", absl::Hex(p), " is not in memory that ",
                     "cuda:", device_index_, "'s allocator has handed out"));
  }
  Block& block = it->second;
  if (stream != block.stream &&
      std::find(block.others.begin(), block.others.end(), stream) ==
          block.others.end()) {
    block.others.push_back(stream);
  }
  return absl::OkStatus();
}

void CudaAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

void CudaAllocator::EmptyCacheLocked() {
  if (!pending_.empty()) ProcessPendingLocked(/*wait=*/true);
  if (cached_bytes_ == 0) return;
  DeviceGuard guard(device_index_);
  for (auto& [key, blocks] : free_blocks_) {
    for (void* ptr : blocks) {
      const cudaError_t error = cudaFree(ptr);
      LOG_IF(ERROR, error != cudaSuccess)
          << "cudaFree on cuda:" << device_index_ << ": "
          << cudaGetErrorString(error);
      reserved_bytes_ -= static_cast<int64_t>(key.second);
    }
    blocks.clear();
  }
  free_blocks_.clear();
  cached_bytes_ = 0;
}

void* CudaAllocator::AllocateFromPoolLocked(int pool_id, size_t rounded,
                                            cudaStream_t stream) {
  Pool& pool = pools_[pool_id];
  auto it = pool.free.find(rounded);
  if (it != pool.free.end() && !it->second.empty()) {
    void* ptr = it->second.back();
    it->second.pop_back();
    live_[reinterpret_cast<uintptr_t>(ptr)] = {rounded, stream, {}, pool_id};
    return ptr;
  }
  // No retry after releasing the cache: cudaFree is illegal in a capture.
  DeviceGuard guard(device_index_);
  void* ptr = nullptr;
  cudaError_t error;
  {
    // The capture runs in thread-local mode, which forbids cudaMalloc on
    // this thread (cudaErrorStreamCaptureUnsupported); relaxed mode allows
    // it for this one call, as PyTorch's caching allocator does. The memory
    // is not part of the graph: the pool keeps it until the graph goes.
    CaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
    error = cudaMalloc(&ptr, rounded);
  }
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    // Only a true out-of-memory may reach Storage's "out of memory" death;
    // anything else (a capture-mode refusal, a sticky error from an
    // earlier kernel) is named here.
    LOG_IF(FATAL, error != cudaErrorMemoryAllocation)
        << CudaErrorToStatus(error, "cudaMalloc", __FILE__, __LINE__).message()
        << " for " << rounded << " bytes on cuda:" << device_index_
        << " inside a graph capture (pool " << pool_id
        << "): not an out-of-memory";
    LOG(ERROR)
        << CudaErrorToStatus(error, "cudaMalloc", __FILE__, __LINE__).message()
        << " for " << rounded << " bytes on cuda:" << device_index_
        << " inside a graph capture";
    return nullptr;
  }
  ++malloc_calls_;
  reserved_bytes_ += static_cast<int64_t>(rounded);
  pool.bytes += static_cast<int64_t>(rounded);
  live_[reinterpret_cast<uintptr_t>(ptr)] = {rounded, stream, {}, pool_id};
  return ptr;
}

int CudaAllocator::BeginCapturePool() {
  std::lock_guard<std::mutex> lock(mu_);
  const int id = next_pool_++;
  pools_[id];
  t_capture_pool[this] = id;
  return id;
}

void CudaAllocator::EndCapturePool() { t_capture_pool.erase(this); }

void CudaAllocator::ReleasePool(int pool_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto pool = pools_.find(pool_id);
  if (pool == pools_.end()) return;
  DeviceGuard guard(device_index_);
  for (auto& [size, blocks] : pool->second.free) {
    for (void* ptr : blocks) {
      const cudaError_t error = cudaFree(ptr);
      LOG_IF(ERROR, error != cudaSuccess)
          << "cudaFree on cuda:" << device_index_ << ": "
          << cudaGetErrorString(error);
      reserved_bytes_ -= static_cast<int64_t>(size);
    }
  }
  pools_.erase(pool);
}

int64_t CudaAllocator::PoolBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = 0;
  for (const auto& [id, pool] : pools_) bytes += pool.bytes;
  return bytes;
}

int64_t CudaAllocator::ReservedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_bytes_;
}

int64_t CudaAllocator::CachedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

int64_t CudaAllocator::PendingBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_bytes_;
}

int64_t CudaAllocator::CudaMallocCalls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return malloc_calls_;
}

CudaAllocator* GetCudaAllocator(int index) {
  return static_cast<CudaAllocator*>(GetAllocator(Device::CUDA(index)));
}

absl::Status RecordStream(const Tensor& t, cudaStream_t stream) {
  if (!t.device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RecordStream: ", t.Describe(), " is not on a CUDA device"));
  }
  if (t.nbytes() == 0 || t.raw_data() == nullptr) return absl::OkStatus();
  return GetCudaAllocator(t.device().index)->RecordStream(t.raw_data(), stream);
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
