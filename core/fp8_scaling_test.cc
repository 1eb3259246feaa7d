#include "core/fp8_scaling.h"

#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

// The reference: the scale of every cast in a sequence, from the recipe's
// definition in float64, with the whole amax sequence in hand.
std::vector<double> ReferenceScales(const std::vector<double>& amaxes,
                                    bool delayed, double fp8_max, int margin,
                                    int history_len, bool use_max) {
  std::vector<double> out;
  double scale = 1.0;
  for (size_t t = 0; t < amaxes.size(); ++t) {
    double basis;
    int m = margin;
    if (!delayed) {
      basis = amaxes[t];
      m = 0;
    } else if (t == 0) {
      basis = amaxes[0];
    } else {
      const size_t first =
          t >= static_cast<size_t>(history_len) ? t - history_len : 0;
      basis = amaxes[t - 1];
      if (use_max) {
        for (size_t i = first; i < t; ++i) {
          if (std::isnan(amaxes[i])) {
            basis = amaxes[i];
            break;
          }
          basis = std::max(basis, amaxes[i]);
        }
      }
    }
    if (basis > 0 && std::isfinite(basis)) {
      scale = fp8_max / basis / std::pow(2.0, m);
    }
    out.push_back(scale);
  }
  return out;
}

struct Params {
  const char* format;
  const char* recipe;
  int margin;
  int history_len;
  const char* algo;
};

class Fp8ScalerTest : public ::testing::TestWithParam<Params> {};

TEST_P(Fp8ScalerTest, ScalesEqualTheReference) {
  const Params& p = GetParam();
  const Fp8Recipe recipe =
      *MakeFp8Recipe(p.format, p.recipe, p.margin, p.history_len, p.algo);
  for (const Fp8Format format :
       {recipe.forward_format, recipe.backward_format}) {
    std::mt19937 rng(3);
    std::uniform_real_distribution<double> log2_amax(-20, 10);
    std::vector<double> amaxes;
    for (int i = 0; i < 40; ++i) {
      amaxes.push_back(static_cast<float>(std::exp2(log2_amax(rng))));
    }
    // Spikes, a zero, an infinity and a NaN: each kept out of the scale.
    amaxes[5] = 0.0;
    amaxes[9] = 1e6;
    amaxes[17] = INFINITY;
    amaxes[23] = NAN;
    Fp8TensorScaler scaler(recipe, format);
    EXPECT_EQ(scaler.scale(), 1.0f);
    const std::vector<double> want =
        ReferenceScales(amaxes, recipe.recipe == Fp8ScalingRecipe::kDelayed,
                        Fp8Max(format), p.margin, p.history_len,
                        recipe.amax_compute_algo == Fp8AmaxComputeAlgo::kMax);
    for (size_t t = 0; t < amaxes.size(); ++t) {
      const float got = scaler.Next(static_cast<float>(amaxes[t]));
      EXPECT_NEAR(got, want[t], std::ldexp(want[t], -23))
          << "cast " << t << " of " << Fp8FormatName(format);
      EXPECT_EQ(got, scaler.scale());
    }
    if (recipe.recipe == Fp8ScalingRecipe::kDelayed) {
      ASSERT_EQ(scaler.amax_history().size(),
                static_cast<size_t>(p.history_len));
      EXPECT_EQ(scaler.amax_history().front(),
                static_cast<float>(amaxes.back()));
    } else {
      EXPECT_TRUE(scaler.amax_history().empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, Fp8ScalerTest,
    ::testing::Values(Params{"hybrid", "tensorwise", 0, 1, "most_recent"},
                      Params{"e4m3", "tensorwise", 2, 16, "max"},
                      Params{"hybrid", "delayed", 0, 1, "most_recent"},
                      Params{"hybrid", "delayed", 1, 4, "max"},
                      Params{"e4m3", "delayed", 0, 16, "max"},
                      Params{"e4m3", "delayed", 3, 8, "most_recent"}));

TEST(Fp8RecipeTest, FormatsAndHandWorkedScales) {
  const Fp8Recipe hybrid =
      *MakeFp8Recipe("hybrid", "delayed", 0, 1, "most_recent");
  EXPECT_EQ(hybrid.forward_format, Fp8Format::kE4M3);
  EXPECT_EQ(hybrid.backward_format, Fp8Format::kE5M2);
  const Fp8Recipe e4m3 = *MakeFp8Recipe("e4m3", "tensorwise", 0, 1, "max");
  EXPECT_EQ(e4m3.backward_format, Fp8Format::kE4M3);
  EXPECT_EQ(Fp8ScaleFromAmax(2.0f, 448.0f, 0, 1.0f), 224.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(2.0f, 448.0f, 2, 1.0f), 56.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(0.0f, 448.0f, 0, 5.0f), 5.0f);
  // Delayed, history 2, max: 448/1 first (own amax), then from history.
  Fp8TensorScaler s(*MakeFp8Recipe("e4m3", "delayed", 0, 2, "max"),
                    Fp8Format::kE4M3);
  EXPECT_EQ(s.Next(1.0f), 448.0f);
  EXPECT_EQ(s.Next(4.0f), 448.0f);  // max{1}
  EXPECT_EQ(s.Next(2.0f), 112.0f);  // max{4, 1}
  EXPECT_EQ(s.Next(2.0f), 112.0f);  // max{2, 4}
  EXPECT_EQ(s.Next(8.0f), 224.0f);  // max{2, 2}
  EXPECT_EQ(DescribeFp8Recipe(hybrid),
            "hybrid delayed (margin 0, amax history 1, most_recent)");
}

TEST(Fp8RecipeTest, BadValuesNameTheFlag) {
  EXPECT_THAT(
      std::string(
          MakeFp8Recipe("e5m2", "delayed", 0, 1, "max").status().message()),
      ::testing::HasSubstr("--fp8-format: 'e5m2'"));
  EXPECT_THAT(
      std::string(
          MakeFp8Recipe("hybrid", "mxfp8", 0, 1, "max").status().message()),
      ::testing::HasSubstr("--fp8-recipe: 'mxfp8'"));
  EXPECT_THAT(
      std::string(
          MakeFp8Recipe("hybrid", "delayed", 0, 0, "max").status().message()),
      ::testing::HasSubstr("--fp8-amax-history-len: 0"));
  EXPECT_THAT(
      std::string(
          MakeFp8Recipe("hybrid", "delayed", 0, 1, "mean").status().message()),
      ::testing::HasSubstr("--fp8-amax-compute-algo: 'mean'"));
  EXPECT_THAT(
      std::string(
          MakeFp8Recipe("hybrid", "delayed", -1, 1, "max").status().message()),
      ::testing::HasSubstr("--fp8-margin: -1"));
}

}  // namespace
}  // namespace mcc
