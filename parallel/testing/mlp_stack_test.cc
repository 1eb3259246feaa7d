// The non-GPT MlpStack trained through the model contract alone: under
// DP 2 with ZeRO-3 (FSDP optim_grads_params), under PP 2 (the pipeline
// executor, 1F1B) and PP 2 with two virtual stages each (interleaved 1F1B),
// in real processes, against its own serial run.
//
// Error bound: the layouts sum the same fp32 gradients in another order
// (per-rank sums, then the reduction), which moves each gradient element by
// a few ulp (~1e-7 relative); plain SGD with momentum turns that into
// parameter differences of the same relative size per step, so after
// kSteps steps losses and parameters agree to about 1e-6. The test allows
// 1e-5 (relative, absolute below magnitude 1).
#include "parallel/testing/mlp_stack.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "optim/optimizer.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/testing/train_step.h"

namespace mcc {
namespace parallel {
namespace testing {
namespace {

constexpr int kSteps = 6;
constexpr int kMicrobatches = 4;  // Global, per step.
constexpr double kTolerance = 1e-5;

MlpStackConfig Config() { return MlpStackConfig(); }

struct Result {
  // Mean loss of micro-batch m of step s at [s * kMicrobatches + m].
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  int64_t unit_hook_calls = 0;  // The counting hooks' (ZeRO-3 run).
};

// Counts every unit hook call; installed next to FSDP's to show that hooks
// compose on a real step.
class CountingHooks : public UnitHooks {
 public:
  absl::Status BeforeForward(int) override { return Count(); }
  absl::Status AfterForward(int) override { return Count(); }
  absl::Status BeforeBackward(int) override { return Count(); }
  absl::Status AfterBackward(int) override { return Count(); }
  int64_t calls = 0;

 private:
  absl::Status Count() {
    ++calls;
    return absl::OkStatus();
  }
};

// Trains on `state`'s groups (null: serial): its pipeline group splits the
// blocks (into `virtual_stages` chunks per stage, interleaved as Megatron
// assigns them), its data group splits the micro-batches, sharded with
// ZeRO-3 when `zero3` (one chunk only).
absl::StatusOr<Result> Train(ParallelState* state, bool zero3,
                             int virtual_stages = 1) {
  const MlpStackConfig config = Config();
  comm::ProcessGroup* pp = state ? state->pipeline() : nullptr;
  comm::ProcessGroup* dp = state ? state->data() : nullptr;
  const int stages = pp ? pp->size() : 1;
  const int stage = pp ? pp->rank() : 0;
  const int dp_size = dp ? dp->size() : 1;
  const int dp_rank = dp ? dp->rank() : 0;
  const int local_mb = kMicrobatches / dp_size;

  LayerContext context;
  MCC_ASSIGN_OR_RETURN(
      MlpStackChunks local,
      CreateMlpStackChunks(config, context, stages, stage, virtual_stages));
  MlpStack* model = local.chunks[0].get();
  if (zero3 && local.chunks.size() != 1) {
    return absl::InvalidArgumentError("ZeRO-3 here wraps one chunk");
  }
  pipeline::PipelineOptions schedule;
  MCC_ASSIGN_OR_RETURN(auto executor,
                       pipeline::PipelineExecutor::Create(
                           local.stages, stages > 1 ? pp : nullptr, schedule));
  optim::OptimizerConfig opt_config;
  opt_config.type = optim::OptimizerType::kSgd;
  opt_config.sgd_momentum = 0.9;
  opt_config.weight_decay = 0.01;
  opt_config.clip_grad = 0;
  optim::OptimizerGroups groups;
  CountingHooks counter;
  std::unique_ptr<fsdp::FullyShardedDataParallel> fsdp;
  std::unique_ptr<optim::Optimizer> opt;
  if (zero3) {
    MCC_RETURN_IF_ERROR(model->AddUnitHooks(&counter));
    fsdp::FsdpConfig fsdp_config;
    fsdp_config.strategy = fsdp::ShardingStrategy::kOptimGradsParams;
    MCC_ASSIGN_OR_RETURN(
        fsdp, fsdp::FullyShardedDataParallel::Wrap(model, dp, fsdp_config));
    MCC_ASSIGN_OR_RETURN(opt, fsdp->CreateOptimizer(opt_config, groups));
    executor->SetLastMicrobatchCallback(
        [f = fsdp.get()](bool last) { f->set_is_last_microbatch(last); });
  } else {
    MCC_ASSIGN_OR_RETURN(
        opt, optim::Optimizer::Create(local.parameters, opt_config, groups));
  }

  Result result;
  result.losses.assign(kSteps * kMicrobatches,
                       std::numeric_limits<double>::quiet_NaN());
  for (int step = 0; step < kSteps; ++step) {
    MCC_RETURN_IF_ERROR(BeginTrainStep(fsdp.get(), local.models));
    auto batches = std::make_shared<std::vector<MlpBatch>>();
    for (int i = 0; i < local_mb; ++i) {
      batches->push_back(MakeMlpBatch(config, step, dp_rank * local_mb + i));
    }
    for (const auto& c : local.chunks) c->SetMicroBatches(batches);
    MCC_ASSIGN_OR_RETURN(pipeline::PipelineStepResult run,
                         executor->Run(local_mb, 1.0f / local_mb));
    // The stage that computes the loss has each micro-batch's.
    for (size_t i = 0; i < run.microbatch_losses.size(); ++i) {
      MCC_ASSIGN_OR_RETURN(LossSum loss, ReadLossSum(run.microbatch_losses[i]));
      result.losses[step * kMicrobatches + dp_rank * local_mb + i] =
          loss.mean();
    }
    MCC_RETURN_IF_ERROR(
        FinishTrainStep(fsdp.get(), local.models, *opt, 0.05).status());
  }
  if (fsdp) {
    MCC_RETURN_IF_ERROR(fsdp->FinishParamGather());
    MCC_RETURN_IF_ERROR(fsdp->GatherFullParams());
  }
  for (const auto& p : local.parameters) {
    result.params[p->name] = p->value.ToFloats();
  }
  if (fsdp) MCC_RETURN_IF_ERROR(fsdp->ReleaseFullParams());
  result.unit_hook_calls = counter.calls;
  return result;
}

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", name);
}

absl::Status WriteResult(const std::string& path, const Result& r) {
  std::ofstream out(path);
  out.precision(17);
  out << "hooks " << r.unit_hook_calls << "\n";
  for (size_t i = 0; i < r.losses.size(); ++i) {
    if (!std::isnan(r.losses[i]))
      out << "loss " << i << " " << r.losses[i] << "\n";
  }
  for (const auto& [name, values] : r.params) {
    out << "param " << name << " " << values.size();
    for (float v : values) out << " " << v;
    out << "\n";
  }
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Adds a rank's file to `r`: losses and parameters it has (later ranks fill
// what earlier ones lacked).
absl::Status MergeResult(const std::string& path, Result* r) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string kind;
    s >> kind;
    if (kind == "hooks") {
      int64_t calls = 0;
      s >> calls;
      r->unit_hook_calls += calls;
    } else if (kind == "loss") {
      size_t i = 0;
      double v = 0;
      s >> i >> v;
      if (i < r->losses.size()) r->losses[i] = v;
    } else if (kind == "param") {
      std::string name;
      size_t n = 0;
      s >> name >> n;
      std::vector<float> values(n);
      for (float& v : values) s >> v;
      r->params.emplace(name, std::move(values));
    }
  }
  return absl::OkStatus();
}

bool Close(double a, double b) {
  return std::abs(a - b) <= kTolerance * std::max(1.0, std::abs(b));
}

MCC_WORKER(mlp_train) {
  const std::string layout = std::getenv("MCC_TEST_CASE");
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    std::fprintf(stderr, "init: %s\n", world.status().ToString().c_str());
    return 3;
  }
  ParallelSizes sizes;
  if (layout != "zero3_dp2") sizes.pipeline = 2;
  auto state = ParallelState::Create(world->group, sizes);
  if (!state.ok()) {
    std::fprintf(stderr, "state: %s\n", state.status().ToString().c_str());
    return 3;
  }
  auto result = Train(state->get(), layout == "zero3_dp2",
                      layout == "pp2_interleaved" ? 2 : 1);
  if (!result.ok()) {
    std::fprintf(stderr, "train: %s\n", result.status().ToString().c_str());
    return 4;
  }
  const int rank = world->group->rank();
  if (!WriteResult(TmpPath(absl::StrCat(layout, ".rank", rank)), *result)
           .ok()) {
    return 5;
  }
  return 0;
}

class MlpStackParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MlpStackParityTest, MatchesSerialRun) {
  const std::string layout = GetParam();
  auto workers =
      comm::testing::RunWorkers(2, "mlp_train", absl::Seconds(90), [&](int) {
        return std::map<std::string, std::string>{{"MCC_TEST_CASE", layout}};
      });
  for (const auto& w : workers) {
    ASSERT_EQ(w.exit_code, 0) << comm::testing::Describe(workers);
  }
  Result parallel;
  parallel.losses.assign(kSteps * kMicrobatches,
                         std::numeric_limits<double>::quiet_NaN());
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(
        MergeResult(TmpPath(absl::StrCat(layout, ".rank", rank)), &parallel)
            .ok());
  }
  auto serial = Train(nullptr, false);
  ASSERT_TRUE(serial.ok()) << serial.status();

  double worst_loss = 0, worst_param = 0;
  for (size_t i = 0; i < serial->losses.size(); ++i) {
    ASSERT_FALSE(std::isnan(parallel.losses[i])) << "loss " << i << " missing";
    EXPECT_TRUE(Close(parallel.losses[i], serial->losses[i]))
        << layout << " step " << i / kMicrobatches << " micro-batch "
        << i % kMicrobatches << ": " << parallel.losses[i] << " vs serial "
        << serial->losses[i];
    worst_loss =
        std::max(worst_loss, std::abs(parallel.losses[i] - serial->losses[i]));
  }
  ASSERT_EQ(parallel.params.size(), serial->params.size());
  for (const auto& [name, expected] : serial->params) {
    ASSERT_EQ(parallel.params.count(name), 1u) << name << " missing";
    const std::vector<float>& got = parallel.params.at(name);
    ASSERT_EQ(got.size(), expected.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(Close(got[i], expected[i]))
          << layout << " " << name << "[" << i << "]: " << got[i]
          << " vs serial " << expected[i];
      worst_param = std::max(
          worst_param, std::abs(static_cast<double>(got[i]) - expected[i]));
    }
  }
  std::printf("%s: worst loss difference %.3g, parameter difference %.3g\n",
              layout.c_str(), worst_loss, worst_param);
  // Training moved the model: the comparison is not between initial states.
  double first = 0, last = 0;
  for (int m = 0; m < kMicrobatches; ++m) {
    first += serial->losses[m];
    last += serial->losses[(kSteps - 1) * kMicrobatches + m];
  }
  EXPECT_LT(last, 0.9 * first);
  if (layout == "zero3_dp2") {
    // 4 hook calls per block and micro-batch, composed with FSDP's.
    EXPECT_EQ(parallel.unit_hook_calls,
              int64_t{4} * Config().num_blocks * kMicrobatches * kSteps);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, MlpStackParityTest,
                         ::testing::Values("zero3_dp2", "pp2",
                                           "pp2_interleaved"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace testing
}  // namespace parallel
}  // namespace mcc
