// Standalone runner for the transformer-kernel benchmarks:
//   bench_nn [--quick]
#include <cstring>

#include "core/ops/bench_nn.h"

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
  }
  mcc::ops::RunNnBenchmarks(quick);
  return 0;
}
