#include "parallel/model.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mcc {
namespace parallel {
namespace {

// Two units of one parameter each; the second is shared with another stage.
class TwoUnitModel : public Model {
 public:
  TwoUnitModel() {
    for (int i = 0; i < 2; ++i) {
      auto p = std::make_shared<Parameter>();
      p->name = absl::StrCat("p", i);
      p->main_grad = Tensor::Full({2}, 1.0, DType::kFloat32);
      params_.push_back(p);
      units_.push_back({p});
    }
    params_[1]->shared_with_other_stage = true;
  }
  const ParameterList& parameters() const override { return params_; }
  const std::vector<ParameterList>& units() const override { return units_; }
  comm::ProcessGroup* tensor_group() const override { return nullptr; }

  // One unit's forward and backward as a model would run them.
  absl::Status Step(int unit) {
    absl::Status s = CallBeforeForward(unit);
    if (s.ok()) s = CallAfterForward(unit);
    if (s.ok()) s = CallBeforeBackward(unit);
    if (s.ok()) s = CallAfterBackward(unit);
    if (s.ok()) s = CallGradsReady(units_[unit]);
    return s;
  }

 private:
  ParameterList params_;
  std::vector<ParameterList> units_;
};

class Recorder : public UnitHooks {
 public:
  Recorder(std::string name, std::vector<std::string>* log)
      : name_(std::move(name)), log_(log) {}
  absl::Status BeforeForward(int unit) override {
    log_->push_back(absl::StrCat(name_, ".bf", unit));
    return fail_ ? absl::InternalError(name_) : absl::OkStatus();
  }
  absl::Status AfterBackward(int unit) override {
    log_->push_back(absl::StrCat(name_, ".ab", unit));
    return absl::OkStatus();
  }
  bool fail_ = false;

 private:
  std::string name_;
  std::vector<std::string>* log_;
};

TEST(ModelTest, UnitHooksComposeInInstallOrder) {
  TwoUnitModel model;
  std::vector<std::string> log;
  Recorder a("a", &log), b("b", &log);
  ASSERT_TRUE(model.AddUnitHooks(&a).ok());
  ASSERT_TRUE(model.AddUnitHooks(&b).ok());
  EXPECT_EQ(model.AddUnitHooks(&a).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(model.Step(0).ok());
  EXPECT_EQ(log,
            (std::vector<std::string>{"a.bf0", "b.bf0", "a.ab0", "b.ab0"}));

  log.clear();
  model.RemoveUnitHooks(&a);
  ASSERT_TRUE(model.Step(1).ok());
  EXPECT_EQ(log, (std::vector<std::string>{"b.bf1", "b.ab1"}));
}

TEST(ModelTest, FirstFailingHookStopsTheEvent) {
  TwoUnitModel model;
  std::vector<std::string> log;
  Recorder a("a", &log), b("b", &log);
  a.fail_ = true;
  ASSERT_TRUE(model.AddUnitHooks(&a).ok());
  ASSERT_TRUE(model.AddUnitHooks(&b).ok());
  absl::Status s = model.Step(0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(log, (std::vector<std::string>{"a.bf0"}));
}

TEST(ModelTest, GradReadyHooksComposeAndLeaveSharedToSync) {
  TwoUnitModel model;
  std::vector<std::string> log;
  auto hook = [&log](std::string name) {
    return [&log, name](const std::vector<Parameter*>& ready) {
      for (Parameter* p : ready) log.push_back(name + "." + p->name);
      return absl::OkStatus();
    };
  };
  const int first = model.AddGradReadyHook(hook("x"));
  model.AddGradReadyHook(hook("y"));
  EXPECT_EQ(model.AddGradReadyHook(nullptr), -1);
  ASSERT_TRUE(model.Step(0).ok());
  ASSERT_TRUE(model.Step(1).ok());  // p1 is shared: not reported here.
  EXPECT_EQ(log, (std::vector<std::string>{"x.p0", "y.p0"}));

  log.clear();
  model.RemoveGradReadyHook(first);
  ASSERT_TRUE(model.SyncSharedGradients(nullptr).ok());
  EXPECT_EQ(log, (std::vector<std::string>{"y.p1"}));
}

TEST(ModelTest, ZeroGradientsZeroesEveryParameter) {
  TwoUnitModel model;
  model.ZeroGradients();
  for (const auto& p : model.parameters()) {
    EXPECT_EQ(p->main_grad.ToFloats(), (std::vector<float>{0, 0})) << p->name;
  }
  EXPECT_TRUE(model.FinalizeGradients().ok());  // No TP: nothing to sum.
}

}  // namespace
}  // namespace parallel
}  // namespace mcc
