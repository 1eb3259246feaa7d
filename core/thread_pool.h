#ifndef CORE_THREAD_POOL_H_
#define CORE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mcc {

// A fixed set of worker threads for data-parallel loops in CPU kernels.
//
// The calling thread takes part in every loop, so a pool of N threads uses
// N - 1 workers. Loops do not nest: a ParallelFor called from inside a
// worker runs serially.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), each at least
  // `grain` long (the last may be shorter), and returns when all are done.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t)>& fn);

  // How long an idle worker polls for the next loop before it sleeps.
  // Waking a sleeping worker costs tens of microseconds on a VM, as long as
  // a whole loop of a decoding step at a few rows, so without it the
  // caller did most loops alone (inference's 8-sequence step took one
  // core's CPU time on two threads). Polling burns its core, so it is off
  // (0) unless a process that owns its cores asks (tools/serve).
  void SetSpinMicros(int64_t micros) { spin_micros_.store(micros); }

  // The process-wide pool: DefaultThreads() threads when first used.
  static ThreadPool& Global();
  // Resizes the global pool (before any loop runs, typically from main).
  static void SetGlobalThreads(int num_threads);
  // The count set by SetDefaultThreads, else the MCC_NUM_THREADS or
  // OMP_NUM_THREADS environment variable, else every core.
  static int DefaultThreads();
  // The count the global pool starts with, when positive (a binary's
  // --num-threads flag sets it from main); zero leaves it to the
  // environment. Takes effect if called before Global() is first used.
  static void SetDefaultThreads(int num_threads);

 private:
  void WorkerLoop(int worker);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int64_t num_chunks_ = 0;
  int64_t next_chunk_ = 0;
  int64_t chunks_done_ = 0;
  uint64_t generation_ = 0;
  // generation_, readable without mu_ by polling workers.
  std::atomic<uint64_t> published_generation_{0};
  std::atomic<int64_t> spin_micros_{0};
  bool stop_ = false;
  std::mutex loop_mu_;  // One loop at a time per pool.
};

}  // namespace mcc

#endif  // CORE_THREAD_POOL_H_
