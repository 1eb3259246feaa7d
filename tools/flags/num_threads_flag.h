#ifndef TOOLS_FLAGS_NUM_THREADS_FLAG_H_
#define TOOLS_FLAGS_NUM_THREADS_FLAG_H_

// --num-threads, the CPU kernels' thread count, for every binary that runs
// them (core/thread_pool.h takes it through ThreadPool::SetDefaultThreads).

#include <cstdint>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(int32_t, num_threads);

namespace mcc {
namespace flags {

// Hands --num-threads to the thread pool; call from main after the flags
// are parsed, before any CPU kernel runs.
void ApplyNumThreadsFlag();

}  // namespace flags
}  // namespace mcc

#endif  // TOOLS_FLAGS_NUM_THREADS_FLAG_H_
