#ifndef CORE_OP_PROFILE_H_
#define CORE_OP_PROFILE_H_

// Wall time per op, for finding where a training step's time goes (the
// per-op breakdown of `train --timing-log-level 2` and the benchmarks).
//
// Off by default: a disabled ScopedOpTimer costs one relaxed atomic load.
// When enabled, each op's outermost call on a thread adds its wall time and
// one call to the op's entry (an op called inside another op's timer counts
// only in the outer one, so the entries never add up to more than the time
// spent in ops). Thread-safe; entries are keyed by the op name's string
// literal.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace mcc {

class OpProfile {
 public:
  struct Entry {
    std::string op;
    int64_t calls = 0;
    double seconds = 0;
  };

  static void Enable(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  static bool enabled() { return enabled_.load(std::memory_order_relaxed); }
  // Adds one call of `op` (a string literal) taking `seconds`.
  static void Add(const char* op, double seconds);
  // The entries collected since the last Reset, most time first.
  static std::vector<Entry> Snapshot();
  static void Reset();
  // "Gemm 120.1 ms (54.0%), FlashAttentionForward 30.2 ms (13.6%), ..., outside
  // ops 12.0 ms (5.4%)", shares of `total_seconds` (the time the entries
  // were collected over); at most `max_entries` ops, the rest summed.
  static std::string Format(const std::vector<Entry>& entries,
                            double total_seconds, int max_entries = 12);

 private:
  static std::atomic<bool> enabled_;
};

// Times the enclosing scope as one call of `op` when profiling is enabled.
class ScopedOpTimer {
 public:
  explicit ScopedOpTimer(const char* op) {
    if (!OpProfile::enabled()) return;
    counted_ = true;
    if (depth_++ > 0) return;  // Inside another op: the outer one counts.
    op_ = op;
    start_ = std::chrono::steady_clock::now();
  }
  ~ScopedOpTimer() {
    if (!counted_) return;
    --depth_;
    if (op_ == nullptr) return;
    OpProfile::Add(op_, std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - start_)
                            .count());
  }
  ScopedOpTimer(const ScopedOpTimer&) = delete;
  ScopedOpTimer& operator=(const ScopedOpTimer&) = delete;

 private:
  static thread_local int depth_;
  const char* op_ = nullptr;
  bool counted_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mcc

#endif  // CORE_OP_PROFILE_H_
