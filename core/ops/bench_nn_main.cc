// Standalone runner for the transformer-kernel benchmarks:
//   bench_nn [--quick] [--attention] [--cpu-time]
//            [--shape=B,S,H,D] [--only=LABEL] [--reps=N]
// --attention runs the flash-attention lines alone; --cpu-time times by the
// process's CPU time (use it with MCC_NUM_THREADS=1 on a loaded machine).
// With --attention: --shape times one causal shape (e.g. 4,512,8,64, the
// shape of train --preset bench), --only one variant ("fp32", "bf16 dot",
// "bf16 widened", "fp16"), --reps the repetitions a line takes the best of.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/ops/bench_nn.h"

int main(int argc, char** argv) {
  bool attention = false;
  mcc::ops::AttentionBenchmarkOptions options;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (std::strcmp(arg, "--quick") == 0) {
      options.quick = true;
    } else if (std::strcmp(arg, "--attention") == 0) {
      attention = true;
    } else if (std::strcmp(arg, "--cpu-time") == 0) {
      mcc::ops::SetNnBenchmarkCpuTime(true);
    } else if (std::strncmp(arg, "--shape=", 8) == 0) {
      long long b, s, h, d;
      if (std::sscanf(arg + 8, "%lld,%lld,%lld,%lld", &b, &s, &h, &d) != 4 ||
          b <= 0 || s <= 0 || h <= 0 || d <= 0) {
        std::fprintf(stderr, "--shape wants B,S,H,D (positive), got '%s'\n",
                     arg + 8);
        return 2;
      }
      options.b = b;
      options.s = s;
      options.h = h;
      options.d = d;
    } else if (std::strncmp(arg, "--only=", 7) == 0) {
      options.only = arg + 7;
    } else if (std::strncmp(arg, "--reps=", 7) == 0) {
      options.reps = std::atoi(arg + 7);
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", arg);
      return 2;
    }
  }
  if (attention) {
    mcc::ops::RunAttentionBenchmarks(options);
  } else {
    mcc::ops::RunNnBenchmarks(options.quick);
  }
  return 0;
}
