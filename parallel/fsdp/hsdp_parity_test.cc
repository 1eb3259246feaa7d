// HSDP (--num-distributed-optimizer-instances) in real processes (gloo):
// DP 4 in 2 instances of 2 against DP 4 in one, for the distributed
// optimizer (ZeRO-1), optim_grads (ZeRO-2) and optim_grads_params (ZeRO-3),
// 4 steps each; and their checkpoint continuing at one instance for 4 more,
// against the same DP 4 run's next steps.
//
// Bound: both runs hold fp32 state and differ only in the order the fp32
// gradient sums are taken (reduce-scatter within 2 ranks, then across 2
// instances, against one reduce-scatter over 4), so losses and gradient
// norms agree to the fp32 reduction-order tolerance the other parity tests
// use against the serial run: 1e-5 relative.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "gtest/gtest.h"
#include "parallel/parallel_state.h"
#include "training/testing/fsdp_test_util.h"
#include "training/testing/parity_test_util.h"
#include "training/testing/train_test_util.h"

namespace mcc {
namespace fsdp {
namespace {

using optim::testing::TrainResult;

constexpr double kTolerance = 1e-5;

// Env: MCC_STRATEGY, MCC_INSTANCES, MCC_START, MCC_STEPS, MCC_LOAD,
// MCC_SAVE, MCC_RESULT.
MCC_WORKER(hsdp_train) {
  parallel::ParallelSizes sizes;
  sizes.distributed_optimizer_instances =
      std::atoi(std::getenv("MCC_INSTANCES"));
  auto state = optim::testing::InitWorkerState(sizes);
  if (!state.ok()) {
    std::fprintf(stderr, "init: %s\n", state.status().ToString().c_str());
    return 3;
  }
  testing::FsdpTrainOptions o;
  o.base = testing::ParityOptions();
  o.base.steps = std::atoi(std::getenv("MCC_STEPS"));
  o.start_step = std::atoi(std::getenv("MCC_START"));
  auto strategy = ParseShardingStrategy(std::getenv("MCC_STRATEGY"));
  if (!strategy.ok()) return 3;
  o.fsdp.strategy = *strategy;
  o.fsdp.ddp.bucket_size_bytes = 40000;
  o.fsdp.ddp.overlap_grad_reduce = true;
  o.load_path = std::getenv("MCC_LOAD");
  o.save_path = std::getenv("MCC_SAVE");
  // Adam's two fp32 moments of every element, split over the instance:
  // each rank of an instance of k ranks holds about 1/k of them.
  int64_t state_bytes = 0;
  o.on_optimizer = [&](const optim::Optimizer& opt) {
    state_bytes = opt.state_bytes();
  };
  std::string described;
  o.after_step = [&](int, data_parallel::DataParallel* dp) {
    described = dp->Describe();
    return absl::OkStatus();
  };
  auto result = testing::TrainFsdp(o, state->get());
  if (!result.ok()) {
    std::fprintf(stderr, "train: %s\n", result.status().ToString().c_str());
    return 4;
  }
  const int rank = (*state)->world()->rank();
  std::printf("rank %d: %s; %lld bytes of optimizer state\n", rank,
              described.c_str(), static_cast<long long>(state_bytes));
  // The instance's shards together hold the whole state once.
  comm::ProcessGroup* shards = sizes.distributed_optimizer_instances > 1
                                   ? (*state)->instance()
                                   : (*state)->data();
  Tensor total =
      Tensor::Full({1}, static_cast<double>(state_bytes), DType::kInt64);
  if (!shards->AllReduceSync(&total, comm::ReduceOp::kSum).ok()) return 7;
  std::printf("rank %d: the instance holds %lld bytes of optimizer state\n",
              rank, static_cast<long long>(total.data<int64_t>()[0]));
  // HSDP must really be on where asked for.
  if (sizes.distributed_optimizer_instances > 1 &&
      described.find("HSDP: 2 instances of 2 ranks") == std::string::npos) {
    std::fprintf(stderr, "not HSDP: %s\n", described.c_str());
    return 6;
  }
  if (rank == 0) {
    if (!optim::testing::WriteResult(std::getenv("MCC_RESULT"), *result).ok()) {
      return 5;
    }
    std::ofstream(std::string(std::getenv("MCC_RESULT")) + ".bytes")
        << state_bytes << " " << total.data<int64_t>()[0] << "\n";
  }
  return 0;
}

// Rank 0's optimizer state bytes and its instance's total, of the last
// RunHsdp.
struct StateBytes {
  int64_t per_rank = 0, instance = 0;
};
StateBytes last_bytes;

TrainResult RunHsdp(const std::string& strategy, int instances, int start,
                    int steps, const std::string& load,
                    const std::string& save) {
  const std::string out = optim::testing::TmpPath(absl::StrCat(
      "hsdp_", strategy, "_", instances, "_", start, "_", steps, ".txt"));
  auto results =
      comm::testing::RunWorkers(4, "hsdp_train", absl::Seconds(120), [&](int) {
        return std::map<std::string, std::string>{
            {"MCC_STRATEGY", strategy},
            {"MCC_INSTANCES", std::to_string(instances)},
            {"MCC_START", std::to_string(start)},
            {"MCC_STEPS", std::to_string(steps)},
            {"MCC_LOAD", load},
            {"MCC_SAVE", save},
            {"MCC_RESULT", out}};
      });
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  std::ifstream(out + ".bytes") >> last_bytes.per_rank >> last_bytes.instance;
  auto r = optim::testing::ReadResult(out);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult();
}

// The worst relative difference of losses and gradient norms.
double ExpectClose(const TrainResult& a, const TrainResult& b, int offset_b) {
  EXPECT_FALSE(a.loss.empty());
  double worst = 0;
  for (size_t s = 0; s < a.loss.size(); ++s) {
    const size_t t = s + offset_b;
    if (t >= b.loss.size()) {
      ADD_FAILURE() << "step " << t << " missing";
      break;
    }
    const double dl = optim::testing::RelDiff(a.loss[s], b.loss[t]);
    const double dn =
        optim::testing::RelDiff(a.steps[s].grad_norm, b.steps[t].grad_norm);
    EXPECT_LE(dl, kTolerance)
        << "step " << t << " loss " << a.loss[s] << " vs " << b.loss[t];
    EXPECT_LE(dn, kTolerance) << "step " << t << " grad norm";
    worst = std::max({worst, dl, dn});
  }
  return worst;
}

class HsdpParityTest : public ::testing::TestWithParam<std::string> {};

// One run of DP 4 in one instance is the reference for both halves: the
// first kHalf steps of 2 instances of DP 2 (which save), and the next kHalf
// at one instance continuing from their checkpoint.
constexpr int kHalf = 4;

TEST_P(HsdpParityTest, TwoInstancesEqualOneAndTheirCheckpointContinuesAtOne) {
  const std::string strategy = GetParam();
  const std::string path =
      optim::testing::TmpPath(absl::StrCat("hsdp_ckpt_", strategy));
  const TrainResult one = RunHsdp(strategy, 1, 0, 2 * kHalf, "", "");
  const StateBytes bytes_one = last_bytes;
  const TrainResult two = RunHsdp(strategy, 2, 0, kHalf, "", path);
  const StateBytes bytes_two = last_bytes;
  // Each instance holds the whole state once; a rank holds its instance's
  // share: twice as much in an instance of 2 as in one of 4 (up to where
  // the shard boundaries fall).
  std::printf(
      "%s: optimizer state per rank %lld bytes at 1 instance, %lld "
      "at 2; per instance %lld and %lld\n",
      strategy.c_str(), static_cast<long long>(bytes_one.per_rank),
      static_cast<long long>(bytes_two.per_rank),
      static_cast<long long>(bytes_one.instance),
      static_cast<long long>(bytes_two.instance));
  EXPECT_GT(bytes_one.instance, 0);
  EXPECT_EQ(bytes_two.instance, bytes_one.instance);
  EXPECT_NEAR(bytes_one.per_rank * 4.0, bytes_one.instance,
              0.02 * bytes_one.instance);
  EXPECT_NEAR(bytes_two.per_rank * 2.0, bytes_two.instance,
              0.02 * bytes_two.instance);
  ASSERT_EQ(two.loss.size(), static_cast<size_t>(kHalf));
  const double worst = ExpectClose(two, one, 0);
  std::printf("%s: 2 instances vs 1, worst relative difference %.3g\n",
              strategy.c_str(), worst);
  EXPECT_LT(two.loss[kHalf - 1], two.loss[0]);

  const TrainResult second = RunHsdp(strategy, 1, kHalf, kHalf, path, "");
  ASSERT_EQ(second.loss.size(), static_cast<size_t>(kHalf));
  const double worst_continued = ExpectClose(second, one, kHalf);
  std::printf("%s: saved at 2 instances, continued at 1: worst %.3g\n",
              strategy.c_str(), worst_continued);
}

INSTANTIATE_TEST_SUITE_P(Strategies, HsdpParityTest,
                         ::testing::Values("optim", "optim_grads",
                                           "optim_grads_params"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace fsdp
}  // namespace mcc
