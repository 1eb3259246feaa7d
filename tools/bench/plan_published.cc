// tools/plan's predictions beside published throughput: Megatron-LM's H100
// weak- and strong-scaling runs and torchtitan's Llama 3.1 8B (see
// planner/published_runs.h for the configurations and their sources).
//   tools/bazel run //tools/bench:plan_published [-- --sources]
//   tools/bazel run //tools/bench:plan_published -- --explain ROW
// (ROW: the row's index from 0, as printed) prints tools/plan's breakdown.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "planner/plan_report.h"
#include "planner/published_runs.h"

int main(int argc, char** argv) {
  const bool sources = argc > 1 && std::strcmp(argv[1], "--sources") == 0;
  // What if the device reached another share of its GEMM peak.
  double gemm_efficiency = 0;
  if (argc > 2 && std::strcmp(argv[1], "--gemm-efficiency") == 0) {
    gemm_efficiency = std::atof(argv[2]);
  }
  auto all_runs = [&] {
    auto runs = mcc::planner::PublishedRuns();
    if (gemm_efficiency > 0) {
      for (auto& r : runs)
        r.job.cluster.device.gemm_efficiency = gemm_efficiency;
    }
    return runs;
  };
  if (argc > 2 && std::strcmp(argv[1], "--explain") == 0) {
    const auto runs = all_runs();
    const int row = std::atoi(argv[2]);
    if (row < 0 || row >= static_cast<int>(runs.size())) {
      std::fprintf(stderr, "--explain %s: rows are 0 to %zu\n", argv[2],
                   runs.size() - 1);
      return 2;
    }
    auto c = mcc::planner::ComparePublished(runs[row]);
    if (!c.ok()) {
      // Show the published layout's breakdown all the same: why it misses.
      std::fprintf(stderr, "%s\n", std::string(c.status().message()).c_str());
      auto p = mcc::planner::Predict(runs[row].job, runs[row].layout);
      if (p.ok()) {
        std::printf("%s",
                    mcc::planner::FormatExplain(runs[row].job, *p).c_str());
      }
      return 1;
    }
    std::printf(
        "%s\n%s", runs[row].name.c_str(),
        mcc::planner::FormatExplain(runs[row].job, c->prediction).c_str());
    return 0;
  }
  std::printf(
      "| run | GPUs | layout (planner's name) | published MFU | predicted "
      "MFU | error (points) | published tokens/s/GPU | predicted | fits "
      "(published system / here) |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  double worst = 0;
  int failed = 0;
  const auto runs = all_runs();
  for (size_t row = 0; row < runs.size(); ++row) {
    const auto& run = runs[row];
    auto c = mcc::planner::ComparePublished(run);
    if (!c.ok()) {
      std::printf("| %zu %s | | | | %s | | | | |\n", row, run.name.c_str(),
                  std::string(c.status().message()).c_str());
      ++failed;
      continue;
    }
    worst = std::fmax(worst, std::fabs(c->mfu_error_points));
    std::string tokens = "", predicted_tokens = "";
    if (run.published_tokens_per_gpu > 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.0f", run.published_tokens_per_gpu);
      tokens = buf;
      std::snprintf(
          buf, sizeof buf, "%.0f (%+.0f%%)", c->predicted_tokens_per_gpu,
          100 *
              (c->predicted_tokens_per_gpu / run.published_tokens_per_gpu - 1));
      predicted_tokens = buf;
    }
    std::printf(
        "| %zu %s | %d | %s | %.1f%% | %.1f%% | %+.1f | %s | %s | %s |\n", row,
        run.name.c_str(), run.job.cluster.world(),
        c->prediction.layout.Name().c_str(), 100 * run.published_mfu,
        100 * c->predicted_mfu, c->mfu_error_points, tokens.c_str(),
        predicted_tokens.c_str(),
        (std::string(c->fits_published_system ? "yes" : "no") + " / " +
         (c->prediction.fits ? "yes" : "no"))
            .c_str());
  }
  std::printf("\nworst |error|: %.1f points; %d runs not predicted\n", worst,
              failed);
  if (sources) {
    std::printf("\n");
    for (const auto& run : all_runs()) {
      std::printf("- %s: %s. Assumed: %s.\n", run.name.c_str(),
                  run.source.c_str(), run.assumed.c_str());
    }
  }
  return failed == 0 ? 0 : 1;
}
