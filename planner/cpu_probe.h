#ifndef PLANNER_CPU_PROBE_H_
#define PLANNER_CPU_PROBE_H_

#include "core/dtype.h"
#include "models/gpt/gpt_config.h"
#include "planner/device_spec.h"

namespace mcc {
namespace planner {

// Measures this machine as a device for `ranks_per_node` CPU ranks that
// share it: on the threads one rank gets (cores / ranks, train's default),
// the best 1024^3 GEMM rate in `dtype` (the peak train's MFU uses), the rate
// of a GEMM shaped as the model's (one sequence times hidden times hidden,
// each at most 2048; its ratio to the peak is the GEMM efficiency), the
// model's own GEMMs (a layer's and the output layer's, forward and
// backward) per TP degree relative to it (DeviceSpec::gemm_mix_factor), and
// causal flash attention's rate relative to it; over every core, streaming
// copy bandwidth (RankMemoryBandwidth's share of it); the cores per rank when
// ranks outnumber cores (DeviceSpec::core_share); and TCP loopback bandwidth
// and round-trip latency. Takes a few seconds; not thread-safe (it resizes the
// kernel thread pool for the measurement and restores it).
// `threads_per_rank`: the kernel threads each rank runs with (train's
// --num-threads); 0 for train's default, cores / ranks.
DeviceSpec MeasureCpuDevice(const gpt::GPTConfig& model, DType dtype,
                            int ranks_per_node, int threads_per_rank = 0);

// Seconds by the clock that times one probe call: the wall clock, or with
// MCC_PROBE_CLOCK=thread_cpu (read once) the calling thread's CPU time
// where `on_this_thread` (the call's work runs on the calling thread). The
// CPU clock predicts an idle machine's step on a loaded one (other
// processes' time slices do not count); it suits runs of one kernel thread
// a rank (--num-threads 1), whose GEMMs run on the calling thread.
double ProbeClockSeconds(bool on_this_thread);

// The kernel threads a rank of the probe runs with: `num_threads` where set
// (> 0), else train's default of the cores shared out over the node's ranks.
int ProbeThreadsPerRank(int cores, int ranks_per_node, int num_threads);

// The probe's GEMM readings onto *d: the peak (fp32_flops, bf16_flops) is
// the fastest of the 1024^3 GEMM, the shaped GEMM at `rows` rows and at
// `small_rows`, so gemm_efficiency and gemm_small_efficiency are the shaped
// readings over it and the model's GEMMs run at the shaped rate even when
// the cube ran slower (bf16 kernels chosen per shape; a loaded reading).
void SetGemmRates(double peak, double shaped, double shaped_small, double rows,
                  double small_rows, DeviceSpec* d);

// The copy bandwidth a rank gets while it runs, out of the node's
// `node_bandwidth` over all its `cores`: the ranks that run at once split it,
// and no more run at once than there are cores. (DeviceSpec's rates are for a
// rank with a core of its own; the step-time model spreads the ranks' time
// over the cores with DeviceSpec::core_share, so dividing by all the ranks
// here would count the sharing twice.)
double RankMemoryBandwidth(double node_bandwidth, int ranks, int cores);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_CPU_PROBE_H_
