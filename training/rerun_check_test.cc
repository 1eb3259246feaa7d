#include "training/rerun_check.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace mcc {
namespace training {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(RerunCheckTest, NonFiniteValuesAreAlwaysSuspicious) {
  RerunCheck check({});
  EXPECT_EQ(check.Suspicion(2.0, 1.0), "");
  EXPECT_EQ(check.Suspicion(kNan, 1.0), "the loss is nan");
  EXPECT_EQ(check.Suspicion(2.0, kInf), "the gradient norm is inf");
}

TEST(RerunCheckTest, SpikesCountOnlyWhenAskedAndAgainstTheWindow) {
  RerunCheckOptions options;
  options.check_spiky_loss = true;
  options.spike_factor = 10;
  options.window = 3;
  RerunCheck check(options);
  // Nothing to compare with yet.
  EXPECT_EQ(check.Suspicion(1000, 1), "");
  check.Accept(5, 1);
  check.Accept(2, 1);
  EXPECT_EQ(check.Suspicion(50, 1), "");  // 10 x 5 exactly: not above.
  EXPECT_NE(check.Suspicion(50.5, 1).find("the loss 50.5 is above 10 x the "
                                          "largest of the last 2 steps (5)"),
            std::string::npos);
  // The gradient norm is not checked unless asked.
  EXPECT_EQ(check.Suspicion(3, 1e9), "");
  // The window forgets the 5 after three more steps.
  check.Accept(2, 1);
  check.Accept(2, 1);
  check.Accept(2, 1);
  EXPECT_NE(check.Suspicion(21, 1), "");
  // Non-finite values never enter the window.
  check.Accept(kNan, 1);
  check.Accept(2, kInf);
  EXPECT_EQ(check.Suspicion(20, 1), "");
}

TEST(RerunCheckTest, LargeGradsAgainstTheirOwnWindow) {
  RerunCheckOptions options;
  options.check_large_grads = true;
  RerunCheck check(options);
  check.Accept(3, 2);
  EXPECT_EQ(check.Suspicion(1000, 20), "");
  EXPECT_NE(check.Suspicion(3, 20.1).find("gradient norm"), std::string::npos);
}

TEST(RerunCheckTest, InjectionsReadNanWhereTheirTypeSays) {
  RerunCheckOptions options;
  options.injection_rate = 4;
  RerunCheck transient(options);
  EXPECT_EQ(transient.SeenLoss(3, 2.5, false), 2.5);
  EXPECT_TRUE(std::isnan(transient.SeenLoss(4, 2.5, false)));
  EXPECT_EQ(transient.SeenLoss(4, 2.5, true), 2.5);
  options.injection = RerunCheckOptions::Injection::kPersistent;
  RerunCheck persistent(options);
  EXPECT_TRUE(std::isnan(persistent.SeenLoss(8, 2.5, false)));
  EXPECT_TRUE(std::isnan(persistent.SeenLoss(8, 2.5, true)));
  options.injection = RerunCheckOptions::Injection::kCorrect;
  RerunCheck correct(options);
  EXPECT_EQ(correct.SeenLoss(8, 2.5, false), 2.5);
}

TEST(RerunCheckTest, InjectionTypesParseByMegatronsNames) {
  EXPECT_EQ(*ParseInjection("persistent_error"),
            RerunCheckOptions::Injection::kPersistent);
  EXPECT_FALSE(ParseInjection("sometimes").ok());
}

}  // namespace
}  // namespace training
}  // namespace mcc
