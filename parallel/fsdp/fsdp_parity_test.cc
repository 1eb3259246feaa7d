// Every sharding strategy in real processes (gloo) against the serial run
// with gradient accumulation: DP 2 and 4, TP 2 (with SP) x DP 2, and for
// optim_grads_params also untied embeddings, full recomputation and bf16.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "parallel/parallel_state.h"
#include "training/testing/fsdp_test_util.h"
#include "training/testing/parity_test_util.h"
#include "training/testing/train_test_util.h"

namespace mcc {
namespace fsdp {
namespace {

using optim::testing::TrainOptions;
using optim::testing::TrainResult;

struct Case {
  std::string name;
  ShardingStrategy strategy = ShardingStrategy::kOptimGradsParams;
  int world = 2;
  int tp = 1;
  bool untied = false;
  bool recompute = false;
  DType dtype = DType::kFloat32;
  double tolerance = 1e-5;
};

std::vector<Case> Cases() {
  std::vector<Case> v;
  for (ShardingStrategy s :
       {ShardingStrategy::kNoShard, ShardingStrategy::kOptim,
        ShardingStrategy::kOptimGrads, ShardingStrategy::kOptimGradsParams}) {
    const std::string n(ShardingStrategyName(s));
    v.push_back({n + "_dp2", s, 2});
    v.push_back({n + "_dp4", s, 4});
    v.push_back({n + "_tp2_dp2", s, 4, 2});
  }
  Case untied{"optim_grads_params_dp2_untied"};
  untied.untied = true;
  v.push_back(untied);
  Case recompute{"optim_grads_params_dp2_recompute"};
  recompute.recompute = true;
  v.push_back(recompute);
  Case grads_recompute{"optim_grads_dp2_recompute_untied",
                       ShardingStrategy::kOptimGrads};
  grads_recompute.recompute = grads_recompute.untied = true;
  v.push_back(grads_recompute);
  // bf16: gathered 16-bit weights round the fp32 shards exactly as the
  // serial optimizer rounds its main copies; only the fp32 reduction order
  // differs, which bf16 can amplify by one rounding step here and there.
  Case bf16{"optim_grads_params_dp2_bf16"};
  bf16.dtype = DType::kBFloat16;
  bf16.tolerance = 5e-4;
  v.push_back(bf16);
  return v;
}

const Case& FindCase(const std::string& name) {
  static const auto* cases = new std::vector<Case>(Cases());
  return optim::testing::FindCase(*cases, name);
}

// Every strategy's per-step work (gathers, prefetch, reduce-scatters, the
// sharded optimizer step) repeats from the second step on; 5 steps cover
// warm-up and the first decayed learning rates.
constexpr int kSteps = 5;

TrainOptions Options(const Case& c) {
  TrainOptions o = testing::ParityOptions();
  o.steps = kSteps;
  o.dtype = c.dtype;
  o.model.untie_embeddings_and_output_weights = c.untied;
  if (c.recompute) {
    o.model.recompute_granularity = gpt::RecomputeGranularity::kFull;
    o.model.recompute_method = gpt::RecomputeMethod::kUniform;
    o.model.recompute_num_layers = 2;
  }
  return o;
}

absl::StatusOr<std::unique_ptr<parallel::ParallelState>> Init(int tp) {
  parallel::ParallelSizes sizes;
  sizes.tensor = tp;
  return optim::testing::InitWorkerState(sizes);
}

MCC_WORKER(fsdp_train) {
  const Case& c = FindCase(std::getenv("MCC_TEST_CASE"));
  auto state = Init(c.tp);
  if (!state.ok()) {
    std::fprintf(stderr, "init: %s\n", state.status().ToString().c_str());
    return 3;
  }
  testing::FsdpTrainOptions o;
  o.base = Options(c);
  o.base.sequence_parallel = c.tp > 1;
  o.fsdp.strategy = c.strategy;
  o.fsdp.ddp.bucket_size_bytes = 40000;
  o.fsdp.ddp.overlap_grad_reduce = true;
  FsdpStats stats;
  o.after_step = [&](int, data_parallel::DataParallel* dp) {
    // The replicated strategies gather and scatter nothing per unit.
    if (auto* f = dynamic_cast<FullyShardedDataParallel*>(dp)) {
      stats = f->stats();
    }
    return absl::OkStatus();
  };
  auto result = testing::TrainFsdp(o, state->get());
  if (!result.ok()) {
    std::fprintf(stderr, "train: %s\n", result.status().ToString().c_str());
    return 4;
  }
  std::printf(
      "rank %d: %lld gathers (%lld prefetched), %lld reduce-scatters, "
      "peak %d units gathered\n",
      (*state)->world()->rank(), static_cast<long long>(stats.gathers),
      static_cast<long long>(stats.prefetched_gathers),
      static_cast<long long>(stats.reduce_scatters), stats.peak_gathered_units);
  if ((*state)->world()->rank() == 0) {
    auto s = optim::testing::WriteResult(
        optim::testing::TmpPath(c.name + ".txt"), *result);
    if (!s.ok()) return 5;
  }
  return 0;
}

TrainResult Serial(const Case& c) {
  TrainOptions o = Options(c);
  o.use_ddp = false;
  auto r = optim::testing::Train(o, nullptr);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult();
}

class FsdpParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(FsdpParityTest, EqualsSerialLosses) {
  const Case& c = GetParam();
  auto parallel = optim::testing::RunParityWorkers(c.world, "fsdp_train",
                                                   c.name, absl::Seconds(90));
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  const TrainResult serial = Serial(c);
  const double worst = optim::testing::ExpectMatchesSerial(
      *parallel, serial, kSteps, c.tolerance, c.tolerance * 10);
  std::printf("%s: worst relative loss difference %.3g over %d steps\n",
              c.name.c_str(), worst, kSteps);
  EXPECT_LT(parallel->loss[kSteps - 1], parallel->loss[0]);
}

INSTANTIATE_TEST_SUITE_P(Strategies, FsdpParityTest,
                         ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace fsdp
}  // namespace mcc
