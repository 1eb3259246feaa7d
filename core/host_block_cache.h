#ifndef CORE_HOST_BLOCK_CACHE_H_
#define CORE_HOST_BLOCK_CACHE_H_

// Keeps large host blocks mapped after they are freed, so that the next
// request of about the same size reuses memory whose pages are already
// backed (a caching allocator for host memory, as PyTorch's CUDA caching
// allocator is for device memory).
//
// Why: a training step frees and takes again the same large buffers (the
// [tokens, vocabulary] logits and their gradient, GEMM outputs), and a page
// touched for the first time costs a page fault: on the virtual machines
// this project runs on, about 15 us per 4 KiB page, so 110-140 ms for a
// 32 MiB buffer (measured with a C program on the AMD EPYC Zen 5 VM,
// 2026-12-02). glibc does not keep such blocks: blocks above its mmap
// threshold (at most 32 MiB, even when told more) are unmapped on free,
// and a thread's arena cannot hold a block over 64 MiB at all.
//
// Blocks of 2 MiB and more are whole multiples of 2 MiB, mapped 2 MiB-aligned
// with MADV_HUGEPAGE (fewer faults where transparent huge pages are
// allowed); smaller ones (from 128 KiB: what glibc itself would map and
// unmap each time) are multiples of 64 KiB. Medium blocks matter as much:
// attention's per-head scratch under context parallelism (~600 KiB) went
// through glibc, whose heap placed each take at a fresh address often
// enough to make the backward kernel 9x slower.
// A request takes the smallest cached block that is at least its size and
// wastes at most a quarter of it; otherwise it maps a new one. Freed blocks
// stay cached up to a limit, beyond which the blocks freed longest ago
// are unmapped (a step frees the sizes it will take again): the most that was
// ever live at once (at least 256 MiB), so a process holds at most about twice
// its own peak, and never more than the cap given at construction. When a
// mapping fails, every cached block is unmapped and the mapping is tried once
// more.
//
// Memory handed out is not zeroed (as malloc's is not). Thread-safe.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "absl/container/flat_hash_map.h"

namespace mcc {

class HostBlockCache {
 public:
  // Requests of at least this many bytes are served here.
  static constexpr size_t kMinBlockBytes = size_t{128} << 10;
  // Blocks of at least kGranule bytes are multiples of it (one x86-64 huge
  // page) and aligned to it; smaller blocks are multiples of kSmallGranule,
  // page-aligned.
  static constexpr size_t kGranule = size_t{2} << 20;
  static constexpr size_t kSmallGranule = size_t{64} << 10;

  // The block size a request of `bytes` takes (0 on overflow or for 0).
  static size_t BlockBytes(size_t bytes);

  // `max_cached_bytes`: the most freed memory ever kept mapped.
  explicit HostBlockCache(size_t max_cached_bytes);
  ~HostBlockCache();
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;

  // A block of at least `bytes` bytes (BlockBytes(bytes)), 2 MiB-aligned
  // when it is 2 MiB or more, page-aligned otherwise; nullptr when the
  // memory cannot be mapped.
  void* Allocate(size_t bytes);
  // Returns a block from Allocate to the cache. Dies on a pointer it did
  // not hand out (a double free or a foreign pointer).
  void Free(void* ptr);

  // Unmaps every cached block.
  void Release();

  // Bytes of freed blocks kept mapped, and of blocks handed out.
  size_t cached_bytes() const;
  size_t live_bytes() const;
  // Requests served from the cache and by new mappings, since creation.
  int64_t hits() const;
  int64_t misses() const;

  // The default cap: a quarter of physical memory shared by the node's
  // local ranks (LOCAL_WORLD_SIZE), or MCC_HOST_CACHE_BYTES when set (0
  // turns caching off).
  static size_t DefaultMaxCachedBytes();

 private:
  void* MapLocked(size_t block_bytes);
  // Records `ptr` (a block of `block_bytes`) as live and returns it.
  void* HandOutLocked(void* ptr, size_t block_bytes);
  void UnmapLocked(void* ptr, size_t block_bytes);
  void TrimLocked(size_t limit);
  size_t LimitLocked() const;

  const size_t max_cached_bytes_;
  mutable std::mutex mu_;
  struct Cached {
    void* ptr;
    uint64_t freed_at;  // Order of freeing, for eviction.
  };
  std::multimap<size_t, Cached> cached_;     // block bytes -> block
  absl::flat_hash_map<void*, size_t> live_;  // block -> block bytes
  size_t cached_bytes_ = 0;
  size_t live_bytes_ = 0;
  size_t peak_live_bytes_ = 0;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
  uint64_t frees_ = 0;
};

}  // namespace mcc

#endif  // CORE_HOST_BLOCK_CACHE_H_
