// A bounded, thread-safe cache of cuBLASLt plans (matmul descriptor,
// layouts and the heuristic's algorithm) keyed by what determines them, so
// a GEMM route builds them once per key instead of on every call. Plain
// C++ (no CUDA): the plans' cuBLASLt calls stay with their route, and the
// keying and eviction are tested on the CPU (lt_plan_cache_test).
//
// Key: equality-comparable and hashable with absl::Hash. Plan: whatever the
// route keeps (its destructor releases the descriptors). A plan is handed
// out as a shared_ptr, so evicting it while another thread still launches
// with it is safe: the last holder destroys it.
#ifndef CORE_OPS_CUDA_LT_PLAN_CACHE_H_
#define CORE_OPS_CUDA_LT_PLAN_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace mcc {
namespace ops {
namespace cuda {

// How a cache has been used so far.
struct LtPlanCacheCounts {
  int64_t hits = 0;
  int64_t misses = 0;     // Plans built (or refused) by make.
  int64_t evictions = 0;  // Least recently used plans dropped.
  int64_t size = 0;       // Plans held now.
};

// The largest power of two, up to cuBLASLt's default 256, that divides the
// address: a plan's heuristic must only offer algorithms that work with its
// operands' alignment (a view into a larger tensor may start anywhere), so
// it is part of the key.
inline uint32_t LtAlignmentOf(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align >>= 1;
  return align;
}

template <typename Key, typename Plan>
class LtPlanCache {
 public:
  // Holds at most `capacity` plans (at least 1).
  explicit LtPlanCache(size_t capacity)
      : capacity_(capacity > 0 ? capacity : 1) {}
  LtPlanCache(const LtPlanCache&) = delete;
  LtPlanCache& operator=(const LtPlanCache&) = delete;

  // The plan stored for `key`, or on a miss the one make() returns
  // (absl::StatusOr<std::unique_ptr<Plan>>), stored unless it is an error
  // (an error is returned and nothing is kept). make runs under the cache's
  // lock: concurrent misses on one key build once.
  template <typename Make>
  absl::StatusOr<std::shared_ptr<Plan>> GetOrMake(const Key& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      ++counts_.hits;
      lru_.splice(lru_.begin(), lru_, it->second);  // Most recent first.
      return it->second->second;
    }
    ++counts_.misses;
    absl::StatusOr<std::unique_ptr<Plan>> made = make();
    if (!made.ok()) return made.status();
    std::shared_ptr<Plan> plan = std::move(*made);
    lru_.emplace_front(key, plan);
    index_.emplace(key, lru_.begin());
    while (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
      ++counts_.evictions;
    }
    return plan;
  }

  LtPlanCacheCounts Counts() const {
    std::lock_guard<std::mutex> lock(mu_);
    LtPlanCacheCounts c = counts_;
    c.size = static_cast<int64_t>(lru_.size());
    return c;
  }

  size_t capacity() const { return capacity_; }

 private:
  using Entry = std::pair<Key, std::shared_ptr<Plan>>;

  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // Most recently used first.
  absl::flat_hash_map<Key, typename std::list<Entry>::iterator> index_;
  LtPlanCacheCounts counts_;
};

// One LtPlanCache per device index in [0, devices), each of `capacity`
// plans (a route's plans are per device: its handle, descriptors and
// algorithms belong to one device, and one device's shapes do not evict
// another's).
template <typename Key, typename Plan>
class PerDeviceLtPlanCaches {
 public:
  PerDeviceLtPlanCaches(int devices, size_t capacity) {
    for (int i = 0; i < devices; ++i) {
      caches_.push_back(std::make_unique<LtPlanCache<Key, Plan>>(capacity));
    }
  }
  // Null for an index out of range.
  LtPlanCache<Key, Plan>* Of(int device) {
    if (device < 0 || device >= static_cast<int>(caches_.size())) {
      return nullptr;
    }
    return caches_[device].get();
  }

 private:
  std::vector<std::unique_ptr<LtPlanCache<Key, Plan>>> caches_;
};

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_LT_PLAN_CACHE_H_
