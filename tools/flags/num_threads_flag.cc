#include "tools/flags/num_threads_flag.h"

#include "absl/flags/flag.h"
#include "core/thread_pool.h"

ABSL_FLAG(int32_t, num_threads, 0,
          "Threads for CPU kernels; 0 reads MCC_NUM_THREADS or "
          "OMP_NUM_THREADS, else uses every core.");

namespace mcc {
namespace flags {

void ApplyNumThreadsFlag() {
  ThreadPool::SetDefaultThreads(absl::GetFlag(FLAGS_num_threads));
}

}  // namespace flags
}  // namespace mcc
