#include "core/host_block_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "glog/logging.h"

namespace mcc {

HostBlockCache::HostBlockCache(size_t max_cached_bytes)
    : max_cached_bytes_(max_cached_bytes) {}

HostBlockCache::~HostBlockCache() {
  std::lock_guard<std::mutex> lock(mu_);
  TrimLocked(0);
  // Live blocks belong to their holders; they stay mapped.
}

size_t HostBlockCache::DefaultMaxCachedBytes() {
  if (const char* env = std::getenv("MCC_HOST_CACHE_BYTES")) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (end != env && *end == '\0') return static_cast<size_t>(v);
    LOG(WARNING) << "MCC_HOST_CACHE_BYTES='" << env
                 << "' is not a byte count; using the default";
  }
  size_t ranks = 1;
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE")) {
    ranks = std::max<long long>(1, std::atoll(local));
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return (size_t{1} << 30) / ranks;
  return static_cast<size_t>(pages) * static_cast<size_t>(page) / 4 / ranks;
}

size_t HostBlockCache::BlockBytes(size_t bytes) {
  const size_t granule = bytes >= kGranule ? kGranule : kSmallGranule;
  const size_t block = (bytes + granule - 1) / granule * granule;
  return block < bytes ? 0 : block;  // Overflow.
}

void* HostBlockCache::Allocate(size_t bytes) {
  const size_t block = BlockBytes(bytes);
  if (block == 0) return nullptr;  // Overflow or zero.
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cached_.lower_bound(block);
  if (it != cached_.end() && it->first - block <= it->first / 4) {
    void* ptr = it->second.ptr;
    const size_t got = it->first;
    cached_.erase(it);
    cached_bytes_ -= got;
    ++hits_;
    return HandOutLocked(ptr, got);
  }
  void* ptr = MapLocked(block);
  if (ptr == nullptr && cached_bytes_ > 0) {
    TrimLocked(0);
    ptr = MapLocked(block);
  }
  if (ptr == nullptr) return nullptr;
  ++misses_;
  return HandOutLocked(ptr, block);
}

void* HostBlockCache::HandOutLocked(void* ptr, size_t block) {
  live_.emplace(ptr, block);
  live_bytes_ += block;
  peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
  return ptr;
}

void HostBlockCache::Free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  CHECK(it != live_.end()) << "HostBlockCache::Free: " << ptr
                           << " was not handed out by this cache (double "
                              "free or a foreign pointer)";
  const size_t block = it->second;
  live_.erase(it);
  live_bytes_ -= block;
  const size_t limit = LimitLocked();
  if (block > limit) {
    UnmapLocked(ptr, block);
    return;
  }
  cached_.emplace(block, Cached{ptr, frees_++});
  cached_bytes_ += block;
  TrimLocked(limit);
}

size_t HostBlockCache::LimitLocked() const {
  constexpr size_t kFloor = size_t{256} << 20;
  return std::min(max_cached_bytes_, std::max(kFloor, peak_live_bytes_));
}

void HostBlockCache::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  TrimLocked(0);
}

size_t HostBlockCache::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

size_t HostBlockCache::live_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_bytes_;
}

int64_t HostBlockCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

int64_t HostBlockCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

void* HostBlockCache::MapLocked(size_t block) {
  if (block < kGranule) {
    void* ptr = mmap(nullptr, block, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return ptr == MAP_FAILED ? nullptr : ptr;
  }
  // Over-map by one granule and cut the ends off, for 2 MiB alignment.
  const size_t span = block + kGranule;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kGranule - 1) / kGranule * kGranule;
  const size_t head = aligned - start;
  const size_t tail = span - head - block;
  if (head > 0) munmap(raw, head);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + block), tail);
  void* ptr = reinterpret_cast<void*>(aligned);
  // Advice only: where huge pages are off this fails harmlessly.
  (void)madvise(ptr, block, MADV_HUGEPAGE);
  return ptr;
}

void HostBlockCache::UnmapLocked(void* ptr, size_t block) {
  PCHECK(munmap(ptr, block) == 0) << "munmap of a cached host block";
}

void HostBlockCache::TrimLocked(size_t limit) {
  while (cached_bytes_ > limit && !cached_.empty()) {
    // A linear scan: a process caches tens of blocks, not thousands.
    auto oldest = cached_.begin();
    for (auto it = cached_.begin(); it != cached_.end(); ++it) {
      if (it->second.freed_at < oldest->second.freed_at) oldest = it;
    }
    UnmapLocked(oldest->second.ptr, oldest->first);
    cached_bytes_ -= oldest->first;
    cached_.erase(oldest);
  }
}

}  // namespace mcc
