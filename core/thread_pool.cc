#include "core/thread_pool.h"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "glog/logging.h"

namespace mcc {
namespace {

thread_local bool t_inside_pool = false;

std::unique_ptr<ThreadPool>& GlobalSlot() {
  static auto* slot = new std::unique_ptr<ThreadPool>;
  return *slot;
}
std::mutex g_global_mu;
std::atomic<int> g_default_threads{0};

int EnvThreads(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  const int n = std::atoi(v);
  return n > 0 ? n : 0;
}

}  // namespace

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // Ends a polling worker's wait at once.
    published_generation_.store(~uint64_t{0}, std::memory_order_release);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int) {
  t_inside_pool = true;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const int64_t spin = spin_micros_.load(std::memory_order_relaxed);
    if (spin > 0 && generation_ == seen && !stop_) {
      lock.unlock();
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::microseconds(spin);
      int polls = 0;
      while (published_generation_.load(std::memory_order_acquire) == seen) {
        _mm_pause();
        if (++polls % 64 == 0) {
          if (std::chrono::steady_clock::now() > until) break;
          // Lets a thread that is ready to run here (an HTTP thread with a
          // token to send) have the core.
          sched_yield();
        }
      }
      lock.lock();
    }
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (next_chunk_ < num_chunks_) {
      const int64_t c = next_chunk_++;
      const auto* fn = fn_;
      const int64_t begin = c * chunk_;
      const int64_t end = std::min(n_, begin + chunk_);
      lock.unlock();
      (*fn)(begin, end);
      lock.lock();
      if (++chunks_done_ == num_chunks_) done_cv_.notify_all();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (num_threads_ == 1 || t_inside_pool || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> loop_lock(loop_mu_);
  // A few chunks per thread balances uneven work without much overhead.
  int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, 4 * num_threads_);
  const int64_t chunk = (n + chunks - 1) / chunks;
  chunks = (n + chunk - 1) / chunk;
  std::unique_lock<std::mutex> lock(mu_);
  fn_ = &fn;
  n_ = n;
  chunk_ = chunk;
  num_chunks_ = chunks;
  next_chunk_ = 0;
  chunks_done_ = 0;
  ++generation_;
  published_generation_.store(generation_, std::memory_order_release);
  work_cv_.notify_all();
  t_inside_pool = true;
  while (next_chunk_ < num_chunks_) {
    const int64_t c = next_chunk_++;
    const int64_t begin = c * chunk_;
    const int64_t end = std::min(n_, begin + chunk_);
    lock.unlock();
    fn(begin, end);
    lock.lock();
    ++chunks_done_;
  }
  t_inside_pool = false;
  done_cv_.wait(lock, [&] { return chunks_done_ == num_chunks_; });
  fn_ = nullptr;
}

int ThreadPool::DefaultThreads() {
  int n = g_default_threads.load();
  if (n <= 0) n = EnvThreads("MCC_NUM_THREADS");
  if (n <= 0) n = EnvThreads("OMP_NUM_THREADS");
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, n);
}

void ThreadPool::SetDefaultThreads(int num_threads) {
  g_default_threads.store(num_threads);
}

ThreadPool& ThreadPool::Global() {
  std::lock_guard<std::mutex> lock(g_global_mu);
  auto& slot = GlobalSlot();
  if (slot == nullptr) slot = std::make_unique<ThreadPool>(DefaultThreads());
  return *slot;
}

void ThreadPool::SetGlobalThreads(int num_threads) {
  std::lock_guard<std::mutex> lock(g_global_mu);
  auto& slot = GlobalSlot();
  if (slot != nullptr && slot->num_threads() == num_threads) return;
  slot = std::make_unique<ThreadPool>(num_threads);
  LOG(INFO) << "CPU thread pool: " << num_threads << " threads";
}

}  // namespace mcc
