#ifndef TRAINING_METRICS_H_
#define TRAINING_METRICS_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "core/device.h"
#include "core/dtype.h"
#include "models/gpt/gpt_config.h"

namespace mcc {
namespace training {

// The best of the n^3 GEMMs in `dtype` on `device` run over about half a
// second, on random inputs, in FLOP/s: the peak that MFU is measured
// against. n is 1024 on
// the host, 4096 on a GPU (a 1024^3 GEMM is too short there to time). On a
// device other than the host, each group of 10 GEMMs is timed to a
// device-to-host read of one row, so an asynchronous device is not timed at
// its launch rate, nor the read's latency counted against the GEMMs.
double MeasureGemmPeakFlops(DType dtype, Device device = Device::CPU());

// Logs the bf16 GEMM path chosen for each shape class so far (nothing when no
// choice was measured: fp32 runs, or CPUs without native bf16).
void LogBf16GemmChoices();

// Logs OpProfile's entries (collected over `iterations` iterations that took
// `seconds` in all) as time per iteration by op, and the time outside ops.
void LogOpProfile(int iterations, double seconds);

// Wall-clock time per named region, summed between Reset() calls.
class Timers {
 public:
  void Start(const std::string& name);
  void Stop(const std::string& name);
  // Time measured elsewhere (the trainer's phases).
  void Add(const std::string& name, double seconds);
  void Reset() { totals_.clear(); }
  // "forward-backward 812.3 ms | grad-sync 3.1 ms | ..."
  std::string ToString() const;

 private:
  std::map<std::string, absl::Time> started_;
  std::map<std::string, absl::Duration> totals_;
};

struct IterationMetrics {
  int64_t iteration = 0, train_iters = 0, consumed_samples = 0, skipped = 0;
  // The last step's global batch size (Megatron's column; it changes under
  // --rampup-batch-size).
  int64_t global_batch_size = 0;
  double loss = 0, lr = 0, grad_norm = 0, loss_scale = 1;
  double seconds_per_iteration = 0, tokens_per_sec = 0, tflops = 0, mfu = 0;
  int64_t mem_current_bytes = 0, mem_peak_bytes = 0;
  double eta_seconds = 0;
  // Megatron's optional fields (--log-num-zeros-in-grad, --log-params-norm):
  // logged when not negative.
  int64_t num_zeros = -1;
  double params_norm = -1;
};

// The log line of every --log-interval, and the --metrics-file JSON line.
class MetricsLogger {
 public:
  MetricsLogger(bool enabled, const std::string& metrics_file);
  void Log(const IterationMetrics& m, const Timers* timers);

  static std::string FormatLine(const IterationMetrics& m);
  static std::string FormatJson(const IterationMetrics& m);

 private:
  bool enabled_;
  std::ofstream metrics_;
};

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_METRICS_H_
