#ifndef CORE_OPS_BENCH_NN_H_
#define CORE_OPS_BENCH_NN_H_

namespace mcc {
namespace ops {

// Times the transformer kernels (LayerNorm, RMSNorm, rotary, flash attention,
// cross entropy; forward and backward) and prints one line each: GB/s for
// the memory-bound kernels beside memcpy, GFLOP/s for attention beside an
// fp32 GEMM. `quick` shrinks the sizes (for smoke runs).
void RunNnBenchmarks(bool quick);
// The flash-attention lines alone.
void RunAttentionBenchmarks(bool quick);
// Times by the process's CPU time instead of the wall clock: on a shared,
// loaded machine with one kernel thread (MCC_NUM_THREADS=1) this is the
// kernel's own time, without the time other processes held the core.
void SetNnBenchmarkCpuTime(bool cpu_time);

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_BENCH_NN_H_
