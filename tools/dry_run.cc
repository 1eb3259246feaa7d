#include "tools/dry_run.h"

#include <cstdio>

#include "absl/strings/str_format.h"
#include "core/comm/env.h"
#include "data/tokenizer.h"
#include "glog/logging.h"
#include "planner/layout_search.h"
#include "planner/plan_report.h"
#include "training/model_from_config.h"

namespace mcc {
namespace tools {

int DryRun(const training::TrainConfig& config, const TrainSettings& settings,
           int world_size) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "train: --dry-run: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  };
  int64_t vocab = 257;
  if (config.mock_data()) {
    if (config.vocab_size() > 0) {
      vocab = config.vocab_size();
    }
  } else {
    auto tokenizer = data::CreateTokenizer(
        config.tokenizer_type(),
        data::TokenizerFiles{config.vocab_file(), config.merge_file(),
                             config.tokenizer_model()});
    if (!tokenizer.ok()) return fail(tokenizer.status());
    vocab = (*tokenizer)->vocab_size();
  }
  auto model = training::GPTConfigFromConfig(config, vocab);
  if (!model.ok()) return fail(model.status());
  auto layout = LayoutFromTrainConfig(config, world_size, settings.zero);
  if (!layout.ok()) return fail(layout.status());
  // Ranks on this machine share its cores and memory.
  auto env = comm::DistEnvFromEnvironment();
  const int per_node = env.ok() ? std::max(1, env->local_world_size) : 1;
  const int nodes = std::max(1, world_size / per_node);
  const DType dtype = DTypeFromConfig(config);
  // The probe's kernels run on the threads a rank of the run will
  // (--num-threads; before, cores / ranks whatever it said: a
  // --num-threads 1 run on 2 cores was predicted with 2-thread GEMMs).
  auto cluster =
      MakeCluster("cpu", per_node, nodes, *model, dtype, config.num_threads());
  if (!cluster.ok()) return fail(cluster.status());
  const planner::JobSpec job = MakeJobSpec(*model, dtype, settings, *cluster);
  auto prediction = planner::Predict(job, *layout);
  if (!prediction.ok()) return fail(prediction.status());
  std::fputs(planner::FormatExplain(job, *prediction).c_str(), stdout);
  bool fits = true;
  for (int stage = 0; stage < layout->pp; ++stage) {
    const planner::MemoryBreakdown m =
        planner::EstimateStageMemory(job, *layout, stage);
    // In bytes, for scripts that compare it with a run's mem_peak_bytes.
    std::printf("predicted peak of pipeline stage %d: %.0f bytes a rank\n",
                stage, m.total());
    if (m.total() > cluster->device.memory_bytes) {
      fits = false;
      LOG(WARNING) << absl::StrFormat(
          "--dry-run: the ranks of pipeline stage %d will not fit: %.2f GiB "
          "predicted, %.2f GiB available per rank",
          stage, m.total() / (1 << 30),
          cluster->device.memory_bytes / (1 << 30));
    }
  }
  return fits ? 0 : 1;
}

}  // namespace tools
}  // namespace mcc
