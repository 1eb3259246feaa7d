#include "parallel/testing/train_step.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace parallel {
namespace testing {
namespace {

// Calls in the order the step made them.
using Log = std::vector<std::string>;

ParameterList OneParameter() {
  auto p = std::make_shared<Parameter>();
  p->name = "w";
  p->value = Tensor::Full({2}, 1.0, DType::kFloat32);
  p->main_grad = Tensor::Full({2}, 3.0, DType::kFloat32);
  p->global_shape = {2};
  return {p};
}

class LoggingModel : public Model {
 public:
  LoggingModel(std::string name, Log* log)
      : name_(std::move(name)), log_(log), params_(OneParameter()) {}
  const ParameterList& parameters() const override { return params_; }
  const std::vector<ParameterList>& units() const override { return units_; }
  comm::ProcessGroup* tensor_group() const override { return nullptr; }
  void ZeroGradients() override {
    log_->push_back(name_ + ".ZeroGradients");
    Model::ZeroGradients();
  }
  absl::Status SyncSharedGradients(comm::ProcessGroup* group) override {
    log_->push_back(name_ + ".SyncSharedGradients");
    return Model::SyncSharedGradients(group);
  }
  absl::Status FinalizeGradients() override {
    log_->push_back(name_ + ".FinalizeGradients");
    return Model::FinalizeGradients();
  }

 private:
  std::string name_;
  Log* log_;
  ParameterList params_;
  std::vector<ParameterList> units_;
};

class LoggingDataParallel : public data_parallel::DataParallel {
 public:
  explicit LoggingDataParallel(Log* log) : log_(log) {}
  absl::Status BeginStep() override { return Note("BeginStep"); }
  absl::Status FinishParamGather() override {
    return Note("FinishParamGather");
  }
  void ZeroGrads() override { log_->push_back("dp.ZeroGrads"); }
  void set_is_last_microbatch(bool) override {}
  absl::Status FinishGradSync() override { return Note("FinishGradSync"); }
  absl::Status FinalizeGradients() override {
    return Note("FinalizeGradients");
  }
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> CreateOptimizer(
      const optim::OptimizerConfig&, const optim::OptimizerGroups&) override {
    return absl::UnimplementedError("not needed");
  }
  bool holds_whole_reduced_gradients() const override { return true; }
  absl::Status GatherFullParams() override { return absl::OkStatus(); }
  absl::Status ScatterFullParams() override { return absl::OkStatus(); }
  absl::Status ReleaseFullParams() override { return absl::OkStatus(); }
  bool shards_gradients() const override { return false; }
  const ParameterList& parameters() const override { return params_; }
  comm::ProcessGroup* dp_group() const override { return nullptr; }
  std::string Describe() const override { return "logging"; }

 private:
  absl::Status Note(const std::string& call) {
    log_->push_back("dp." + call);
    return absl::OkStatus();
  }
  Log* log_;
  ParameterList params_;
};

std::unique_ptr<optim::Optimizer> Sgd(const ParameterList& params) {
  optim::OptimizerConfig config;
  config.type = optim::OptimizerType::kSgd;
  config.weight_decay = 0;
  config.clip_grad = 0;
  auto opt = optim::Optimizer::Create(params, config, {});
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? std::move(*opt) : nullptr;
}

TEST(TrainStepTest, WithoutDataParallelTheModelsKeepTheirGradients) {
  Log log;
  LoggingModel a("a", &log), b("b", &log);
  const std::vector<Model*> models = {&a, &b};
  ASSERT_TRUE(BeginTrainStep(nullptr, models).ok());
  EXPECT_EQ(a.parameters()[0]->main_grad.ToFloats(),
            (std::vector<float>{0, 0}));
  b.parameters()[0]->main_grad.Fill(0.5);  // A backward's gradient.
  auto opt = Sgd(b.parameters());
  ASSERT_NE(opt, nullptr);
  absl::StatusOr<optim::StepInfo> info =
      FinishTrainStep(nullptr, models, *opt, 0.1);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(log, (Log{"a.ZeroGradients", "b.ZeroGradients",
                      "a.SyncSharedGradients", "b.SyncSharedGradients",
                      "a.FinalizeGradients", "b.FinalizeGradients"}));
  EXPECT_EQ(b.parameters()[0]->value.ToFloats(),
            (std::vector<float>{0.95f, 0.95f}));
}

TEST(TrainStepTest, TheDataParallelWrapperZeroesAndFinalizes) {
  Log log;
  LoggingModel a("a", &log);
  LoggingDataParallel dp(&log);
  const std::vector<Model*> models = {&a};
  ASSERT_TRUE(BeginTrainStep(&dp, models).ok());
  auto opt = Sgd(a.parameters());
  ASSERT_NE(opt, nullptr);
  ASSERT_TRUE(FinishTrainStep(&dp, models, *opt, 0.1).ok());
  EXPECT_EQ(
      log, (Log{"dp.FinishParamGather", "dp.ZeroGrads", "a.SyncSharedGradients",
                "dp.FinishGradSync", "dp.FinalizeGradients"}));
}

}  // namespace
}  // namespace testing
}  // namespace parallel
}  // namespace mcc
