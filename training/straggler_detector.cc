#include "training/straggler_detector.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace mcc {
namespace training {
namespace {

double MonotonicSeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Seconds in GEMM calls since OpProfile's last reset.
double GemmSeconds() {
  double total = 0;
  for (const OpProfile::Entry& e : OpProfile::Snapshot()) {
    if (absl::EndsWith(e.op, "Gemm")) total += e.seconds;
  }
  return total;
}

double LowerMedian(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t middle = (values.size() - 1) / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  return values[middle];
}

double Ratio(double value, double median) {
  return median > 0 ? value / median : 0;
}

}  // namespace

StragglerReport AnalyzeStepTimes(std::vector<RankStepTimes> ranks,
                                 double threshold) {
  StragglerReport report;
  std::vector<double> busy, gemm;
  for (const RankStepTimes& r : ranks) {
    busy.push_back(r.busy_seconds);
    gemm.push_back(r.gemm_seconds);
  }
  report.threshold = threshold;
  report.median_busy_seconds = LowerMedian(busy);
  report.median_gemm_seconds = LowerMedian(gemm);
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    if (ranks[r].busy_seconds > threshold * report.median_busy_seconds) {
      report.stragglers.push_back(r);
    }
  }
  std::sort(report.stragglers.begin(), report.stragglers.end(),
            [&](int a, int b) {
              return ranks[a].busy_seconds > ranks[b].busy_seconds;
            });
  report.ranks = std::move(ranks);
  return report;
}

std::string StragglerReport::Format(int minmax) const {
  const int n = static_cast<int>(ranks.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return ranks[a].busy_seconds > ranks[b].busy_seconds;
  });
  auto describe = [&](int r) {
    return absl::StrFormat("rank %d busy %.3f s (%.2fx) GEMM %.3f s (%.2fx)", r,
                           ranks[r].busy_seconds,
                           Ratio(ranks[r].busy_seconds, median_busy_seconds),
                           ranks[r].gemm_seconds,
                           Ratio(ranks[r].gemm_seconds, median_gemm_seconds));
  };
  const int shown = std::min(std::max(minmax, 1), n);
  std::vector<std::string> slowest, fastest;
  for (int i = 0; i < shown; ++i) slowest.push_back(describe(order[i]));
  for (int i = n - 1; i >= std::max(shown, n - shown); --i) {
    fastest.push_back(describe(order[i]));
  }
  std::vector<std::string> named;
  for (int r : stragglers) {
    named.push_back(
        absl::StrFormat("rank %d (%.2fx the median)", r,
                        Ratio(ranks[r].busy_seconds, median_busy_seconds)));
  }
  return absl::StrCat(
      "straggler check over ", n, " ranks, per step: median busy ",
      absl::StrFormat("%.3f s, GEMM %.3f s; slowest: ", median_busy_seconds,
                      median_gemm_seconds),
      absl::StrJoin(slowest, "; "),
      fastest.empty()
          ? ""
          : absl::StrCat("; fastest: ", absl::StrJoin(fastest, "; ")),
      absl::StrFormat("; stragglers (above %.2fx): ", threshold),
      named.empty() ? "none" : absl::StrJoin(named, ", "));
}

StragglerDetector::StragglerDetector(comm::ProcessGroup* world,
                                     double threshold)
    : world_(world), threshold_(threshold) {
  OpProfile::Enable(true);
  StartWindow();
}

void StragglerDetector::StartWindow() {
  window_start_seconds_ = MonotonicSeconds();
  blocked_at_start_ = comm::ThreadSecondsBlockedInWait();
  gemm_at_start_ = GemmSeconds();
}

absl::StatusOr<StragglerReport> StragglerDetector::EndWindow(int steps) {
  const double per_step = 1.0 / std::max(steps, 1);
  const double wall = MonotonicSeconds() - window_start_seconds_;
  const double blocked = comm::ThreadSecondsBlockedInWait() - blocked_at_start_;
  // A reset of OpProfile inside the window leaves less than at its start.
  const double gemm = std::max(0.0, GemmSeconds() - gemm_at_start_);
  RankStepTimes mine{wall * per_step, std::max(0.0, wall - blocked) * per_step,
                     gemm * per_step};
  std::vector<RankStepTimes> all = {mine};
  if (world_ != nullptr && world_->size() > 1) {
    MCC_ASSIGN_OR_RETURN(
        Tensor in, Tensor::FromVector({static_cast<float>(mine.step_seconds),
                                       static_cast<float>(mine.busy_seconds),
                                       static_cast<float>(mine.gemm_seconds)},
                                      {3}));
    Tensor out = Tensor::Zeros({world_->size() * 3}, DType::kFloat32);
    MCC_RETURN_IF_ERROR(world_->AllGatherSync(in, &out));
    all.assign(world_->size(), RankStepTimes());
    const float* v = out.data<float>();
    for (int r = 0; r < world_->size(); ++r) {
      all[r] = {v[3 * r], v[3 * r + 1], v[3 * r + 2]};
    }
  }
  StartWindow();
  return AnalyzeStepTimes(std::move(all), threshold_);
}

}  // namespace training
}  // namespace mcc
