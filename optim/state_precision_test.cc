// --use-precision-aware-optimizer: each step against a float64 AdamW from
// the stored (rounded) state, within the storage dtype's unit roundoff;
// bf16 moments against fp32 ones over 50 steps within a derived bound; the
// state's bytes halve; the flags' dtypes as Megatron allows them.
#include "optim/state_precision.h"

#include <cmath>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "optim/optimizer.h"

namespace mcc {
namespace optim {
namespace {

constexpr double kU32 = 1.0 / (1 << 24);  // fp32 unit roundoff.

// Unit roundoff (half an ulp, relative) and the absolute spacing floor of
// subnormals for a storage dtype.
double UnitRoundoff(DType d) {
  switch (d) {
    case DType::kBFloat16:
      return 1.0 / (1 << 8);
    case DType::kFloat16:
      return 1.0 / (1 << 11);
    default:
      return kU32;
  }
}
double SubnormalFloor(DType d) {
  return d == DType::kFloat16 ? std::ldexp(1.0, -25) : 1e-38;
}

std::shared_ptr<Parameter> MakeParam(const std::string& name, int64_t n,
                                     DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  auto p = std::make_shared<Parameter>();
  p->name = name;
  p->value = *Tensor::FromVector(v, {n}, dtype);
  p->main_grad = Tensor::Zeros({n}, DType::kFloat32);
  p->global_shape = {n};
  p->weight_decay = true;
  return p;
}

void FillGrads(const ParameterList& params, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& p : params) {
    float* g = p->main_grad.data<float>();
    for (int64_t i = 0; i < p->main_grad.numel(); ++i) g[i] = nd(rng);
  }
}

OptimizerConfig AdamConfig(StatePrecision precision) {
  OptimizerConfig c;
  c.adam_beta1 = 0.9;
  c.adam_beta2 = 0.95;
  c.adam_eps = 1e-8;
  c.weight_decay = 0.1;
  c.clip_grad = 0;  // The reference needs no norm.
  c.state_precision = precision;
  return c;
}

std::map<std::string, StateTensor> StateByName(Optimizer* opt) {
  std::map<std::string, StateTensor> out;
  for (auto& s : opt->StateTensors()) out[s.name] = s;
  return out;
}

struct Case {
  DType exp_avg, exp_avg_sq, main_params;
};

class StatePrecisionStepTest : public ::testing::TestWithParam<Case> {};

TEST_P(StatePrecisionStepTest, EachStepMatchesFloat64WithinStorageRoundoff) {
  const Case c = GetParam();
  StatePrecision precision{c.main_params, c.exp_avg, c.exp_avg_sq};
  // An fp32 parameter (its own main copy) and a bf16 one (main copy held by
  // the optimizer in --main-params-dtype).
  ParameterList params = {MakeParam("w32", 3000, DType::kFloat32, 1),
                          MakeParam("w16", 1000, DType::kBFloat16, 2)};
  const OptimizerConfig cfg = AdamConfig(precision);
  auto opt = Optimizer::Create(params, cfg, {});
  ASSERT_TRUE(opt.ok()) << opt.status();
  const double lr = 1e-2, b1 = cfg.adam_beta1, b2 = cfg.adam_beta2;
  for (int step = 1; step <= 5; ++step) {
    FillGrads(params, 100 + step);
    auto before = StateByName(opt->get());
    std::map<std::string, std::vector<double>> in;
    for (auto& [name, s] : before) in[name] = s.tensor.ToDoubles();
    ASSERT_TRUE((*opt)->Step(lr).ok());
    auto after = StateByName(opt->get());
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (const auto& p : params) {
      const std::string n = p->name;
      const std::vector<double> g = p->main_grad.ToDoubles();
      const std::vector<double>& p0 = in[n + ".main_param"];
      const std::vector<double>& m0 = in[n + ".exp_avg"];
      const std::vector<double>& v0 = in[n + ".exp_avg_sq"];
      const std::vector<double> m1 = after[n + ".exp_avg"].tensor.ToDoubles();
      const std::vector<double> v1 =
          after[n + ".exp_avg_sq"].tensor.ToDoubles();
      const std::vector<double> p1 =
          after[n + ".main_param"].tensor.ToDoubles();
      const std::vector<double> model = p->value.ToDoubles();
      const DType main_dtype =
          p->value.dtype() == DType::kFloat32 ? DType::kFloat32 : c.main_params;
      for (size_t i = 0; i < g.size(); ++i) {
        const double m = b1 * m0[i] + (1 - b1) * g[i];
        const double v = b2 * v0[i] + (1 - b2) * g[i] * g[i];
        const double update =
            lr / bc1 * m / (std::sqrt(v / bc2) + cfg.adam_eps);
        const double pr = p0[i] * (1 - lr * cfg.weight_decay) - update;
        // Stored = round(fp32 result): the storage roundoff of the result
        // plus a few fp32 roundings of each term summed before it (terms
        // may cancel, so their sizes, not the result's, bound those).
        auto bound = [&](double ref, DType d, double terms) {
          return UnitRoundoff(d) * std::fabs(ref) + 8 * kU32 * terms +
                 SubnormalFloor(d);
        };
        const double m_terms =
            b1 * std::fabs(m0[i]) + (1 - b1) * std::fabs(g[i]);
        const double v_terms = b2 * v0[i] + (1 - b2) * g[i] * g[i];
        ASSERT_LE(std::fabs(m1[i] - m), bound(m, c.exp_avg, m_terms))
            << n << " exp_avg[" << i << "] step " << step;
        ASSERT_LE(std::fabs(v1[i] - v), bound(v, c.exp_avg_sq, v_terms))
            << n << " exp_avg_sq[" << i << "] step " << step;
        // The update divides two fp32 moments: a few more roundoffs of it,
        // and exp_avg's own (absolute, where its terms cancel) error scaled
        // by the step.
        const double denom = std::sqrt(v / bc2) + cfg.adam_eps;
        const double p_terms = std::fabs(p0[i]) + 3 * std::fabs(update) +
                               lr / bc1 * m_terms / denom;
        ASSERT_LE(std::fabs(p1[i] - pr), bound(pr, main_dtype, p_terms))
            << n << " main_param[" << i << "] step " << step;
        // The model's copy rounds the fp32 result once.
        ASSERT_LE(std::fabs(model[i] - pr),
                  bound(pr, p->value.dtype(), p_terms))
            << n << " value[" << i << "] step " << step;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, StatePrecisionStepTest,
    ::testing::Values(Case{DType::kBFloat16, DType::kBFloat16, DType::kFloat32},
                      Case{DType::kFloat16, DType::kFloat16, DType::kFloat16},
                      Case{DType::kFloat32, DType::kBFloat16, DType::kFloat16},
                      Case{DType::kFloat32, DType::kFloat32, DType::kFloat32}));

// bf16 moments against fp32 moments over 50 steps of the same gradients.
// Stored rounding adds at most u |m| to exp_avg per step, decaying by beta1:
// a relative error of at most u / (1 - beta1) (10u here); likewise exp_avg_sq
// at most u / (1 - beta2) (20u), which the square root halves. So each
// step's update lr |m_hat / sqrt(v_hat)| is off by at most 20u of itself,
// and |m_hat / sqrt(v_hat)| <= 3 for beta1^2 < beta2 (with the bias
// corrections at beta1 0.9, beta2 0.95). Over 50 steps:
// |p_bf16 - p_fp32| <= 50 lr 3 (20u), u = 2^-8.
TEST(StatePrecisionTest, Bf16MomentsStayWithinDerivedBoundOfFp32Over50Steps) {
  ParameterList a = {MakeParam("w", 4096, DType::kFloat32, 7)};
  ParameterList b = {MakeParam("w", 4096, DType::kFloat32, 7)};
  auto fp32 = Optimizer::Create(a, AdamConfig(StatePrecision()), {});
  StatePrecision low;
  low.exp_avg = low.exp_avg_sq = DType::kBFloat16;
  auto bf16 = Optimizer::Create(b, AdamConfig(low), {});
  ASSERT_TRUE(fp32.ok() && bf16.ok());
  const double lr = 1e-3;
  const int steps = 50;
  for (int step = 1; step <= steps; ++step) {
    FillGrads(a, 500 + step);
    FillGrads(b, 500 + step);
    ASSERT_TRUE((*fp32)->Step(lr).ok());
    ASSERT_TRUE((*bf16)->Step(lr).ok());
  }
  const std::vector<double> pa = a[0]->value.ToDoubles();
  const std::vector<double> pb = b[0]->value.ToDoubles();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    worst = std::max(worst, std::fabs(pa[i] - pb[i]));
  }
  const double bound = steps * lr * 3 * 20 * UnitRoundoff(DType::kBFloat16);
  std::cout << "bf16 vs fp32 moments, 50 steps: max |dp| " << worst
            << ", bound " << bound << "\n";
  EXPECT_LE(worst, bound);
  EXPECT_GT(worst, 0);  // The moments really were stored in bf16.
}

TEST(StatePrecisionTest, StateBytesHalve) {
  for (DType model : {DType::kFloat32, DType::kBFloat16}) {
    ParameterList a = {MakeParam("w", 1000, model, 1)};
    ParameterList b = {MakeParam("w", 1000, model, 1)};
    StatePrecision low;
    low.exp_avg = low.exp_avg_sq = DType::kBFloat16;
    // The main copy is the optimizer's only for a 16-bit model.
    if (model != DType::kFloat32) low.main_params = DType::kFloat16;
    auto full = Optimizer::Create(a, AdamConfig(StatePrecision()), {});
    auto half = Optimizer::Create(b, AdamConfig(low), {});
    ASSERT_TRUE(full.ok() && half.ok());
    const int64_t per_tensor = 1000 * 4;
    EXPECT_EQ((*full)->state_bytes(),
              (model == DType::kFloat32 ? 2 : 3) * per_tensor);
    EXPECT_EQ((*half)->state_bytes() * 2, (*full)->state_bytes())
        << DTypeName(model);
  }
}

TEST(StatePrecisionTest, LowerStateNeedsAdam) {
  ParameterList p = {MakeParam("w", 10, DType::kFloat32, 1)};
  OptimizerConfig c = AdamConfig(StatePrecision());
  c.type = OptimizerType::kSgd;
  c.state_precision.exp_avg = DType::kBFloat16;
  auto opt = Optimizer::Create(p, c, {});
  ASSERT_FALSE(opt.ok());
  EXPECT_NE(opt.status().message().find("--optimizer adam"), std::string::npos)
      << opt.status();
}

TEST(StatePrecisionTest, FlagsTakeWhatMegatronAllows) {
  EXPECT_EQ(*ParseStateDType("--exp-avg-dtype", "bf16"), DType::kBFloat16);
  EXPECT_EQ(*ParseStateDType("--exp-avg-sq-dtype", "fp16"), DType::kFloat16);
  EXPECT_EQ(*ParseStateDType("--main-params-dtype", "fp16"), DType::kFloat16);
  EXPECT_EQ(*ParseStateDType("--main-params-dtype", "fp32"), DType::kFloat32);
  // Megatron's --main-params-dtype has no bf16; fp8 storage is not here.
  auto bad = ParseStateDType("--main-params-dtype", "bf16");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--main-params-dtype"),
            std::string::npos);
  auto fp8 = ParseStateDType("--exp-avg-dtype", "fp8");
  ASSERT_FALSE(fp8.ok());
  EXPECT_NE(fp8.status().message().find("fp8"), std::string::npos);
}

}  // namespace
}  // namespace optim
}  // namespace mcc
