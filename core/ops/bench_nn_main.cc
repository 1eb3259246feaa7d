// Standalone runner for the transformer-kernel benchmarks:
//   bench_nn [--quick] [--attention] [--cpu-time]
// --attention runs the flash-attention lines alone; --cpu-time times by the
// process's CPU time (use it with MCC_NUM_THREADS=1 on a loaded machine).
#include <cstring>

#include "core/ops/bench_nn.h"

int main(int argc, char** argv) {
  bool quick = false, attention = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--attention") == 0) attention = true;
    if (std::strcmp(argv[i], "--cpu-time") == 0) {
      mcc::ops::SetNnBenchmarkCpuTime(true);
    }
  }
  if (attention) {
    mcc::ops::RunAttentionBenchmarks(quick);
  } else {
    mcc::ops::RunNnBenchmarks(quick);
  }
  return 0;
}
