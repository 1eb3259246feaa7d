#ifndef CORE_OPS_BENCH_NN_H_
#define CORE_OPS_BENCH_NN_H_

#include <cstdint>
#include <string>

namespace mcc {
namespace ops {

// Times the transformer kernels (LayerNorm, RMSNorm, rotary, flash attention,
// cross entropy; forward and backward) and prints one line each: GB/s for
// the memory-bound kernels beside memcpy, GFLOP/s for attention beside an
// fp32 GEMM. `quick` shrinks the sizes (for smoke runs).
void RunNnBenchmarks(bool quick);
// The flash-attention lines alone.
void RunAttentionBenchmarks(bool quick);
struct AttentionBenchmarkOptions {
  bool quick = false;
  // One causal shape [b, s, h, d] instead of the default ones (d > 0), e.g.
  // train --preset bench's b4 s512 h8 d64; the document lines are skipped.
  int64_t b = 0, s = 0, h = 0, d = 0;
  // One variant by its label ("fp32", "bf16 dot", ...); empty: all.
  std::string only;
  // Timed repetitions of each line (best of them), after one warm-up.
  int reps = 3;
};
void RunAttentionBenchmarks(const AttentionBenchmarkOptions& options);
// Times by the process's CPU time instead of the wall clock: on a shared,
// loaded machine with one kernel thread (MCC_NUM_THREADS=1) this is the
// kernel's own time, without the time other processes held the core.
void SetNnBenchmarkCpuTime(bool cpu_time);

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_BENCH_NN_H_
