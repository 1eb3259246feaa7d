#ifndef PLANNER_CPU_PROBE_H_
#define PLANNER_CPU_PROBE_H_

#include "core/dtype.h"
#include "models/gpt/gpt_config.h"
#include "planner/device_spec.h"

namespace mcc {
namespace planner {

// Measures this machine as a device for `ranks_per_node` CPU ranks that
// share it (each gets 1/ranks of the cores' rates): the best 1024^3 GEMM
// rate in `dtype` (the peak train's MFU uses), the rate of a GEMM shaped as
// the model's (one sequence times hidden times hidden, each at most 2048; its
// ratio to the peak is the GEMM efficiency), causal flash attention's rate
// relative to GEMMs, streaming copy bandwidth over every core, and TCP loopback
// bandwidth and round-trip latency. Takes about two seconds; not thread-safe
// (it sets the kernel thread pool's size for the measurement and restores it).
DeviceSpec MeasureCpuDevice(const gpt::GPTConfig& model, DType dtype,
                            int ranks_per_node);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_CPU_PROBE_H_
