#include "planner/device_spec.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace mcc {
namespace planner {
namespace {

constexpr double kGB = 1e9;
constexpr double kTFLOPS = 1e12;

// The share of the dense bf16 peak that a Hopper GPU's GEMMs sustain in
// training (clocks under a 700 W limit, chunked GEMMs beside overlapped
// communication), calibrated on one published run: Megatron-LM's GPT-3 175B
// on 96 H100 (README, images/strong_scaling.png: 47% MFU), where
// communication and the pipeline bubble are smallest, so compute sets the
// step. With it the planner reproduces the 16 other published Megatron-LM
// H100 runs within 5 MFU points (//planner:published_runs_test). The
// datasheet-typical 0.75 predicted every one of them 12 to 20 points high.
constexpr double kHopperGemmEfficiency = 0.52;

// Latencies and efficiencies are not on datasheets: these are typical NCCL
// small-message latencies and the share of peak that large bf16 GEMMs and
// ring collectives reach in published measurements; they are assumptions.
void SetAssumptions(DeviceSpec* d) {
  d->intra_node_latency = 5e-6;
  d->inter_node_latency = 10e-6;
  d->gemm_efficiency = 0.75;  // A100; H100 and H200 calibrated below.
  d->link_efficiency = 0.8;
  d->attention_efficiency = 0.6;
  d->allocator_overhead = 0.05;
  // Optimizer offload (assumed, not measured): PCIe Gen4 x16 (A100) is 32
  // GB/s a direction, Gen5 x16 (H100, H200) 64 GB/s; copies are taken at
  // 25 GB/s, what pinned copies reach on Gen4 and a conservative figure on
  // Gen5 with eight GPUs sharing the host's root complexes. The host AdamW
  // gets 25 GB/s of host memory per GPU (a two-socket DDR5 node's ~400
  // GB/s over 8 GPUs, halved for the copies beside it).
  d->host_link_bandwidth = 25 * kGB;
  d->host_memory_bandwidth = 25 * kGB;
}

DeviceSpec A100() {
  DeviceSpec d;
  d.name = "a100";
  // NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column): FP32 19.5
  // TFLOPS, BF16 Tensor Core 312 TFLOPS (624 with sparsity), 80 GB HBM2e at
  // 2,039 GB/s, NVLink 600 GB/s (both directions).
  d.fp32_flops = 19.5 * kTFLOPS;
  d.bf16_flops = 312 * kTFLOPS;
  d.memory_bytes = 80 * kGB;
  d.memory_bandwidth = 2039 * kGB;
  d.intra_node_bandwidth = 300 * kGB;
  // NVIDIA DGX A100 datasheet: 8 single-port ConnectX-6 200 Gb/s HDR
  // InfiniBand, one per GPU: 25 GB/s each way.
  d.inter_node_bandwidth = 25 * kGB;
  SetAssumptions(&d);
  d.source =
      "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM); NVIDIA DGX A100 "
      "datasheet (200 Gb/s HDR InfiniBand per GPU)";
  return d;
}

DeviceSpec H100() {
  DeviceSpec d;
  d.name = "h100";
  // NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): FP32 67
  // TFLOPS, BF16 Tensor Core 1,979 TFLOPS with sparsity (989 dense), 80 GB
  // HBM3 at 3.35 TB/s, NVLink 900 GB/s (both directions).
  d.fp32_flops = 67 * kTFLOPS;
  d.bf16_flops = 989 * kTFLOPS;
  d.memory_bytes = 80 * kGB;
  d.memory_bandwidth = 3350 * kGB;
  d.intra_node_bandwidth = 450 * kGB;
  // NVIDIA DGX H100 datasheet: 8 ConnectX-7 400 Gb/s NDR InfiniBand ports
  // for compute, one per GPU: 50 GB/s each way.
  d.inter_node_bandwidth = 50 * kGB;
  SetAssumptions(&d);
  d.gemm_efficiency = kHopperGemmEfficiency;
  d.source =
      "NVIDIA H100 Tensor Core GPU datasheet (SXM); NVIDIA DGX H100 "
      "datasheet (400 Gb/s NDR InfiniBand per GPU); GEMM share of peak "
      "calibrated on Megatron-LM's 96-GPU GPT-3 175B run";
  return d;
}

DeviceSpec H200() {
  DeviceSpec d;
  d.name = "h200";
  // NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column): FP32 67
  // TFLOPS, BF16 Tensor Core 1,979 TFLOPS with sparsity (989 dense), 141 GB
  // HBM3e at 4.8 TB/s, NVLink 900 GB/s (both directions).
  d.fp32_flops = 67 * kTFLOPS;
  d.bf16_flops = 989 * kTFLOPS;
  d.memory_bytes = 141 * kGB;
  d.memory_bandwidth = 4800 * kGB;
  d.intra_node_bandwidth = 450 * kGB;
  // NVIDIA DGX H200 datasheet: 8 ConnectX-7 400 Gb/s NDR ports, one per GPU.
  d.inter_node_bandwidth = 50 * kGB;
  SetAssumptions(&d);
  d.gemm_efficiency = kHopperGemmEfficiency;  // The H100's compute die.
  d.source =
      "NVIDIA H200 Tensor Core GPU datasheet (SXM); NVIDIA DGX H200 "
      "datasheet (400 Gb/s NDR InfiniBand per GPU); GEMM share of peak as "
      "the H100's";
  return d;
}

}  // namespace

std::vector<std::string> ShippedDeviceNames() {
  return {"a100", "h100", "h200"};
}

std::string ProbeDriftNote(const DeviceSpec& device) {
  if (device.probe_drift <= kProbeDriftWarning) return "";
  return absl::StrFormat(
      "note: this machine's GEMM rate moved %.0f%% during the probe: "
      "something else was using it, and the predictions may be off by as "
      "much; plan again on a quiet machine\n",
      100 * device.probe_drift);
}

double GemmEfficiencyAt(const DeviceSpec& device, double rows) {
  if (device.gemm_small_rows <= 0 ||
      device.gemm_rows <= device.gemm_small_rows ||
      device.gemm_small_efficiency <= 0) {
    return device.gemm_efficiency;
  }
  const double lo = std::log2(device.gemm_small_rows);
  const double hi = std::log2(device.gemm_rows);
  const double x = std::clamp(std::log2(std::max(rows, 1.0)), lo, hi);
  const double w = (x - lo) / (hi - lo);
  return device.gemm_small_efficiency +
         w * (device.gemm_efficiency - device.gemm_small_efficiency);
}

double GemmMixFactor(const DeviceSpec& device, int tp) {
  if (device.gemm_mix_factor.empty()) return 1;
  auto it = device.gemm_mix_factor.upper_bound(tp);
  if (it == device.gemm_mix_factor.begin()) return it->second;
  return std::prev(it)->second;
}

absl::StatusOr<DeviceSpec> ShippedDevice(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "a100") return A100();
  if (n == "h100") return H100();
  if (n == "h200") return H200();
  return absl::InvalidArgumentError(absl::StrCat(
      "--device '", name, "': not in the table (",
      absl::StrJoin(ShippedDeviceNames(), ", "), ") and not 'cpu'"));
}

}  // namespace planner
}  // namespace mcc
