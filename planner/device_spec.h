#ifndef PLANNER_DEVICE_SPEC_H_
#define PLANNER_DEVICE_SPEC_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"

namespace mcc {
namespace planner {

// What the planner needs to know about one accelerator (or one CPU rank)
// and the links between them. Rates are per device; bandwidths are one
// direction. Datasheet fields say where they come from in `source`; the
// efficiencies are assumptions, stated as such.
struct DeviceSpec {
  std::string name;
  double bf16_flops = 0;  // Dense peak, FLOP/s (fp16 the same).
  double fp32_flops = 0;  // Dense peak, FLOP/s (no TF32).
  double memory_bytes = 0;
  double memory_bandwidth = 0;      // bytes/s
  double intra_node_bandwidth = 0;  // bytes/s per device, one direction
  double inter_node_bandwidth = 0;  // bytes/s per device, one direction
  double intra_node_latency = 0;    // seconds per message
  double inter_node_latency = 0;
  // Fraction of the peak large GEMMs reach (1 for measured rates).
  double gemm_efficiency = 1;
  // GEMMs of fewer rows run less efficiently: when gemm_small_rows > 0,
  // gemm_efficiency holds at gemm_rows rows and gemm_small_efficiency at
  // gemm_small_rows, interpolated in log2(rows) between them and held
  // beyond (the CPU probe measures both; 0 means no row dependence).
  double gemm_rows = 0;
  double gemm_small_rows = 0;
  double gemm_small_efficiency = 0;
  // The model's own GEMMs at TP degree t (a layer's and the output layer's
  // forward, input-gradient and accumulating weight-gradient GEMMs, FLOP
  // weighted over a step) run at gemm_mix_factor[t] times the rate of the
  // one shaped GEMM gemm_efficiency comes from (the CPU probe measures it
  // per degree: 0.89-0.98 for the bench model, without the fixed cost
  // below). Empty: 1.
  std::map<int, double> gemm_mix_factor;
  // Seconds each GEMM call costs per element of its weight-sized operand
  // (the weight a forward or input-gradient GEMM reads, the gradient a
  // weight-gradient GEMM accumulates), beyond its FLOPs at the rates above:
  // a fixed cost per micro-batch that a micro-batch of fewer rows amortizes
  // over less work (the CPU probe: the intercept of the model's GEMM lists'
  // time against their row count). 0: none modelled (the datasheet table).
  double gemm_seconds_per_weight = 0;
  // Fraction of overlappable communication that computation really hides:
  // 1 where transfers run beside the kernels (NCCL on GPUs); 0 on a CPU
  // whose cores all run kernels, where gloo's transport needs those same
  // cores (measured: ZeRO-3's gathers took 1.2 s of a 4.0 s step outside
  // the ops, none of it hidden).
  double comm_overlap = 1;
  // How far one layout's predicted step moves between runs of a measured
  // device's probe (a fraction; 0 for the datasheet table): layouts
  // predicted closer than this to the first are not reliably ordered.
  double prediction_spread = 0;
  // How far a measured device's speed moved during its own probe: 1 - the
  // slowest over the fastest reading of the shaped GEMM, which the CPU probe
  // takes at its start, middle and end (0 for the datasheet table). Above
  // kProbeDriftWarning something else was using the machine, and every
  // figure measured meanwhile may be off by as much (ProbeDriftNote).
  double probe_drift = 0;
  // Per-rank rate of a ring all-reduce's (and reduce-scatter's) traffic
  // when it differs from a gather's: on a CPU the reduction runs on the
  // cores that also move the data (the CPU probe measures both). 0: the
  // link's bandwidth.
  double reduce_bandwidth = 0;
  // A group smaller than the node's ranks, while the node's other groups
  // run the same collectives (a CPU node whose ranks outnumber its cores,
  // where the others' computing delays each ring step; the CPU probe
  // measures groups of 2): its gather and reduction rates and per-step
  // latency. 0: the whole node's figures above.
  double subgroup_bandwidth = 0;
  double subgroup_reduce_bandwidth = 0;
  double subgroup_latency = 0;
  // Host link (PCIe) bytes/s one direction per device, what optimizer
  // offload's copies take (an assumption: see SetAssumptions); 0 where the
  // device is the host (CPU: offload refused).
  double host_link_bandwidth = 0;
  // Host memory bytes/s one device's share of the CPU AdamW gets (an
  // assumption, for optimizer offload's host share).
  double host_memory_bandwidth = 0;
  // Fraction of the link bandwidth collectives reach.
  double link_efficiency = 1;
  // Flash attention's FLOP rate relative to the GEMMs'.
  double attention_efficiency = 0.5;
  // Extra memory the allocator holds beyond live tensors, as a fraction
  // (a caching GPU allocator's fragmentation; 0 on CPU, where train's
  // allocator counts exactly the bytes asked for).
  double allocator_overhead = 0;
  // Cores per rank when a node's ranks outnumber its cores (the CPU probe);
  // 1 for GPUs. Rates above are for a rank with a core of its own.
  double core_share = 1;
  // Blocks of its own (each 1/n of its input) a ring reduce-scatter over n
  // > 2 ranks holds while reducing: the partial sums it passes on (gloo on
  // CPU tensors, core/comm/gloo_process_group.cc: 2, in memory train's
  // allocator counts). 0: none the allocator sees (NCCL's own buffers).
  int reduce_scatter_partial_blocks = 0;
  // Reductions of bf16/fp16 data widen to fp32 and move 4-byte elements
  // (gloo on CPU tensors); NCCL reduces in the data's own type.
  bool reduces_16bit_in_fp32 = false;
  // Memory-bound kernels on bf16/fp16 data cost what they do on fp32: they
  // widen each element to fp32 in registers and the conversions cost what
  // the halved bytes save (CPU kernels; measured, bench DP 2 ZeRO-1 on a
  // 2-core Zen 5: the ops other than GEMMs and attention took 134 ms a step
  // in bf16 against 98 ms in fp32). GPU kernels move the 16-bit bytes.
  bool elementwise_16bit_at_fp32_cost = false;
  std::string source;

  double PeakFlops(DType dtype) const {
    return dtype == DType::kFloat32 ? fp32_flops : bf16_flops;
  }
};

// Quiet probes' readings of their shaped GEMM moved 0.5-14% (the 40 probes
// of one plan_check run, 2-core VM, 2026-12-03); a neighbour's load has
// halved one reading between probes (docs/benchmarks/2026-12-02.md).
inline constexpr double kProbeDriftWarning = 0.2;

// A line for the report when `device`'s probe drifted more than
// kProbeDriftWarning, empty otherwise.
std::string ProbeDriftNote(const DeviceSpec& device);

// GEMM efficiency at `rows` rows (see DeviceSpec::gemm_small_rows).
double GemmEfficiencyAt(const DeviceSpec& device, double rows);

// DeviceSpec::gemm_mix_factor at TP degree `tp`: the largest listed degree
// not above `tp` (the smallest listed when all are above it); 1 when the
// map is empty.
double GemmMixFactor(const DeviceSpec& device, int tp);

// The machines a job runs on.
struct ClusterSpec {
  DeviceSpec device;
  int devices_per_node = 1;
  int nodes = 1;
  int world() const { return devices_per_node * nodes; }
};

// The shipped table: "a100", "h100", "h200" (SXM parts, in DGX-style
// nodes: NVLink inside a node, one InfiniBand port per GPU between nodes).
absl::StatusOr<DeviceSpec> ShippedDevice(absl::string_view name);
std::vector<std::string> ShippedDeviceNames();

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_DEVICE_SPEC_H_
