#include "training/metrics.h"

#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/allocator.h"
#include "core/op_profile.h"
#include "core/ops/gemm.h"
#include "core/tensor.h"
#include "glog/logging.h"

namespace mcc {
namespace training {

double MeasureGemmPeakFlops(DType dtype, Device device) {
  const int64_t n = device.is_cuda() ? 4096 : 1024;
  const DType in =
      dtype == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
  // Random inputs: a GEMM on constant data runs faster than on real data
  // (13% for bf16 on an H200), which would flatter the peak and so lower
  // MFU.
  auto random = [&](uint32_t seed) -> absl::StatusOr<Tensor> {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> values(static_cast<size_t>(n * n));
    for (float& v : values) v = dist(gen);
    absl::StatusOr<Tensor> host = Tensor::FromVector(values, {n, n}, in);
    if (!host.ok()) return host.status();
    return host->To(device);
  };
  absl::StatusOr<Tensor> a = random(1);
  absl::StatusOr<Tensor> b = random(2);
  if (!a.ok() || !b.ok()) {
    LOG(WARNING) << "GEMM peak measurement failed: "
                 << (a.ok() ? b.status() : a.status());
    return 0;
  }
  Tensor c = Tensor::Empty({n, n}, DType::kFloat32, device);
  // On a device, several GEMMs per timed read: one 4096^3 bf16 GEMM takes
  // about 0.2 ms on an H100, so the read's own tens of microseconds would
  // understate the rate (and flatter MFU) by 10% or more.
  const int per_read = device.is_cpu() ? 1 : 10;
  // At least half a second of GEMMs (the first is warm-up): a handful of
  // 15 ms calls could all land in a moment when another process held a core,
  // and an underestimated peak shows as MFU above 100%.
  double best = 0;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 200; ++i) {
    const absl::Time t0 = absl::Now();
    absl::Status s;
    for (int j = 0; j < per_read && s.ok(); ++j) {
      s = ops::Gemm(*a, false, *b, false, &c);
    }
    if (s.ok() && !device.is_cpu()) {
      // Waits for the GEMM: the copy runs after it on the device's stream.
      absl::StatusOr<Tensor> row = c.Slice(0, 1);
      s = row.ok() ? row->To(Device::CPU()).status() : row.status();
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!s.ok()) {
      LOG(WARNING) << "GEMM peak measurement failed: " << s;
      return 0;
    }
    if (i > 0) best = std::max(best, 2.0 * n * n * n * per_read / seconds);
    if (i >= 6 && absl::Now() - start > absl::Milliseconds(500)) break;
  }
  return best;
}

void LogBf16GemmChoices() {
  const std::vector<ops::Bf16GemmChoice> choices = ops::Bf16GemmChoices();
  if (choices.empty()) return;
  LOG(INFO) << "bf16 GEMM path per shape class (native: oneDNN bf16 matmul ("
            << ops::NativeBf16Isa() << "); widened: sgemm on fp32 copies):";
  for (const ops::Bf16GemmChoice& c : choices) {
    LOG(INFO) << "  " << ops::FormatBf16GemmChoice(c);
  }
}

void LogOpProfile(int iterations, double seconds) {
  std::vector<OpProfile::Entry> entries = OpProfile::Snapshot();
  const int n = std::max(iterations, 1);
  for (OpProfile::Entry& e : entries) e.seconds /= n;
  LOG(INFO) << absl::StrFormat("time per iteration by op (%.1f ms): ",
                               1e3 * seconds / n)
            << OpProfile::Format(entries, seconds / n, 16);
}

void Timers::Start(const std::string& name) { started_[name] = absl::Now(); }

void Timers::Stop(const std::string& name) {
  totals_[name] += absl::Now() - started_[name];
}

void Timers::Add(const std::string& name, double seconds) {
  totals_[name] += absl::Seconds(seconds);
}

std::string Timers::ToString() const {
  std::vector<std::string> parts;
  for (const auto& [name, total] : totals_) {
    parts.push_back(
        absl::StrFormat("%s %.1f ms", name, absl::ToDoubleMilliseconds(total)));
  }
  return absl::StrJoin(parts, " | ");
}

MetricsLogger::MetricsLogger(bool enabled, const std::string& metrics_file)
    : enabled_(enabled) {
  if (enabled_ && !metrics_file.empty()) {
    metrics_.open(metrics_file, std::ios::app);
    if (!metrics_) LOG(ERROR) << "--metrics-file: cannot open " << metrics_file;
  }
}

std::string MetricsLogger::FormatLine(const IterationMetrics& m) {
  const int64_t eta = static_cast<int64_t>(m.eta_seconds);
  // After the grad norm, as Megatron places them.
  std::string optional;
  if (m.num_zeros >= 0) {
    absl::StrAppendFormat(&optional, " | num zeros: %d", m.num_zeros);
  }
  if (m.params_norm >= 0) {
    absl::StrAppendFormat(&optional, " | params norm: %.3f", m.params_norm);
  }
  return absl::StrFormat(
      " iteration %6d/%6d | consumed samples: %9d | elapsed time per "
      "iteration (ms): %.1f | learning rate: %.3E | global batch size: %5d | "
      "lm loss: %.6E | loss "
      "scale: %.1f | grad norm: %.3f%s | skipped iterations: %d | tokens/s: "
      "%.0f | TFLOP/s: %.3f | MFU: %.1f%% | memory: %s (peak %s) | ETA "
      "%d:%02d:%02d",
      m.iteration, m.train_iters, m.consumed_samples,
      m.seconds_per_iteration * 1e3, m.lr, m.global_batch_size, m.loss,
      m.loss_scale, m.grad_norm, optional, m.skipped, m.tokens_per_sec,
      m.tflops, 100 * m.mfu, FormatBytes(m.mem_current_bytes),
      FormatBytes(m.mem_peak_bytes), eta / 3600, eta / 60 % 60, eta % 60);
}

std::string MetricsLogger::FormatJson(const IterationMetrics& m) {
  std::string json = absl::StrFormat(
      "{\"iteration\": %d, \"consumed_samples\": %d, \"global_batch_size\": "
      "%d, \"loss\": %.8g, \"lr\": %.8g, \"grad_norm\": %.8g, \"loss_scale\": "
      "%.8g, \"skipped\": %d, "
      "\"seconds_per_iteration\": %.6g, \"tokens_per_sec\": %.6g, \"tflops\": "
      "%.6g, \"mfu\": %.6g, \"mem_current_bytes\": %d, \"mem_peak_bytes\": "
      "%d}",
      m.iteration, m.consumed_samples, m.global_batch_size, m.loss, m.lr,
      m.grad_norm, m.loss_scale, m.skipped, m.seconds_per_iteration,
      m.tokens_per_sec, m.tflops, m.mfu, m.mem_current_bytes, m.mem_peak_bytes);
  if (m.num_zeros < 0 && m.params_norm < 0) return json;
  json.pop_back();  // The closing brace.
  if (m.num_zeros >= 0)
    absl::StrAppendFormat(&json, ", \"num_zeros\": %d", m.num_zeros);
  if (m.params_norm >= 0) {
    absl::StrAppendFormat(&json, ", \"params_norm\": %.8g", m.params_norm);
  }
  return json + "}";
}

void MetricsLogger::Log(const IterationMetrics& m, const Timers* timers) {
  if (!enabled_) return;
  std::string line = FormatLine(m);
  if (timers != nullptr)
    absl::StrAppend(&line, "\n    timers: ", timers->ToString());
  LOG(INFO) << line;
  if (metrics_.is_open()) {
    metrics_ << FormatJson(m) << "\n";
    metrics_.flush();
  }
}

}  // namespace training
}  // namespace mcc
