// Checkpoint interoperability: whole parameters and optimizer state taken
// from one data-parallel layout continue training in another exactly as the
// serial run continues: serial -> optim_grads_params DP 2, optim_grads_params
// DP 2 -> serial, and optim_grads_params DP 4 -> optim (distributed
// optimizer) DP 2, each 5 + 5 steps against 10 serial steps.
#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "parallel/parallel_state.h"
#include "training/testing/fsdp_test_util.h"

namespace mcc {
namespace fsdp {
namespace {

using optim::testing::TrainResult;

testing::FsdpTrainOptions Half(int start) {
  testing::FsdpTrainOptions o;
  o.base = testing::ParityOptions();
  o.base.steps = 5;
  o.start_step = start;
  return o;
}

// Env: MCC_STRATEGY, MCC_START, MCC_LOAD, MCC_SAVE, MCC_RESULT.
MCC_WORKER(ckpt_train) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  static auto* world = new comm::World;
  auto w = comm::InitWorldFromEnvironment(options);
  if (!w.ok()) return 3;
  *world = *w;
  auto state = parallel::ParallelState::Create(world->group, {});
  if (!state.ok()) return 3;
  testing::FsdpTrainOptions o = Half(std::atoi(std::getenv("MCC_START")));
  auto strategy = ParseShardingStrategy(std::getenv("MCC_STRATEGY"));
  if (!strategy.ok()) return 3;
  o.fsdp.strategy = *strategy;
  o.load_path = std::getenv("MCC_LOAD");
  o.save_path = std::getenv("MCC_SAVE");
  auto result = testing::TrainFsdp(o, state->get());
  if (!result.ok()) {
    std::fprintf(stderr, "%s\n", result.status().ToString().c_str());
    return 4;
  }
  if (world->group->rank() == 0 &&
      !optim::testing::WriteResult(std::getenv("MCC_RESULT"), *result).ok()) {
    return 5;
  }
  return 0;
}

TrainResult RunWorkers(int world, const std::string& strategy, int start,
                       const std::string& load, const std::string& save) {
  const std::string out = optim::testing::TmpPath(
      absl::StrCat("ckpt_", strategy, "_", world, "_", start, ".txt"));
  auto results = comm::testing::RunWorkers(
      world, "ckpt_train", absl::Seconds(90), [&](int) {
        return std::map<std::string, std::string>{
            {"MCC_STRATEGY", strategy},
            {"MCC_START", std::to_string(start)},
            {"MCC_LOAD", load},
            {"MCC_SAVE", save},
            {"MCC_RESULT", out}};
      });
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  auto r = optim::testing::ReadResult(out);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult();
}

TrainResult Serial(int start, const std::string& load,
                   const std::string& save) {
  testing::FsdpTrainOptions o = Half(start);
  o.use_fsdp = false;
  o.load_path = load;
  o.save_path = save;
  auto r = testing::TrainFsdp(o, nullptr);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult();
}

void ExpectContinuesSerial(const TrainResult& second_half) {
  optim::testing::TrainOptions o = testing::ParityOptions();
  o.use_ddp = false;
  auto serial = optim::testing::Train(o, nullptr);
  ASSERT_TRUE(serial.ok()) << serial.status();
  ASSERT_EQ(second_half.loss.size(), 5u);
  for (int s = 0; s < 5; ++s) {
    EXPECT_LE(optim::testing::RelDiff(second_half.loss[s], serial->loss[5 + s]),
              1e-5)
        << "step " << 5 + s << ": " << second_half.loss[s] << " vs serial "
        << serial->loss[5 + s];
  }
}

TEST(CheckpointInteropTest, SerialToFullyShardedDp2) {
  const std::string path = optim::testing::TmpPath("serial_to_fsdp");
  Serial(0, "", path);
  ExpectContinuesSerial(RunWorkers(2, "optim_grads_params", 5, path, ""));
}

TEST(CheckpointInteropTest, FullyShardedDp2ToSerial) {
  const std::string path = optim::testing::TmpPath("fsdp_to_serial");
  RunWorkers(2, "optim_grads_params", 0, "", path);
  ExpectContinuesSerial(Serial(5, path, ""));
}

TEST(CheckpointInteropTest, FullyShardedDp4ToDistributedOptimizerDp2) {
  const std::string path = optim::testing::TmpPath("fsdp4_to_optim2");
  RunWorkers(4, "optim_grads_params", 0, "", path);
  ExpectContinuesSerial(RunWorkers(2, "optim", 5, path, ""));
}

}  // namespace
}  // namespace fsdp
}  // namespace mcc
