// The optimizer in one process: AdamW and SGD against float64 references
// (with clipping and per-parameter weight decay), bf16 and fp16 main
// parameters, loss-scaler skips, and bf16 and fp16 GPT training tracking
// fp32.
#include "optim/optimizer.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "training/testing/train_test_util.h"

namespace mcc {
namespace optim {
namespace {

std::shared_ptr<Parameter> MakeParam(const std::string& name, Shape shape,
                                     bool decay, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(NumElements(shape));
  for (auto& x : v) x = nd(rng);
  auto p = std::make_shared<Parameter>();
  p->name = name;
  p->value = *Tensor::FromVector(v, shape, dtype);
  p->main_grad = Tensor::Zeros(shape, DType::kFloat32);
  p->global_shape = shape;
  p->weight_decay = decay;
  return p;
}

void FillGrads(const ParameterList& params, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& p : params) {
    float* g = p->main_grad.data<float>();
    for (int64_t i = 0; i < p->main_grad.numel(); ++i) g[i] = scale * nd(rng);
  }
}

// Float64 reference of clipping + AdamW / SGD over the same steps.
struct Reference {
  OptimizerConfig cfg;
  std::vector<std::vector<double>> p, m, v;
  std::vector<bool> decay;
  int64_t step = 0;

  explicit Reference(const ParameterList& params, OptimizerConfig c) : cfg(c) {
    for (const auto& q : params) {
      p.push_back(q->value.ToDoubles());
      m.push_back(std::vector<double>(p.back().size(), 0.0));
      v.push_back(std::vector<double>(p.back().size(), 0.0));
      decay.push_back(q->weight_decay);
    }
  }
  // Returns the norm.
  double Step(const ParameterList& params, double lr) {
    std::vector<std::vector<double>> g;
    double sq = 0;
    for (const auto& q : params) {
      g.push_back(q->main_grad.ToDoubles());
      for (double x : g.back()) sq += x * x;
    }
    const double norm = std::sqrt(sq);
    double coef = 1.0;
    if (cfg.clip_grad > 0 && cfg.clip_grad / (norm + 1e-6) < 1)
      coef = cfg.clip_grad / (norm + 1e-6);
    ++step;
    for (size_t k = 0; k < p.size(); ++k) {
      const double wd = decay[k] ? cfg.weight_decay : 0.0;
      for (size_t i = 0; i < p[k].size(); ++i) {
        const double gi = g[k][i] * coef;
        if (cfg.type == OptimizerType::kAdam) {
          const double b1 = cfg.adam_beta1, b2 = cfg.adam_beta2;
          p[k][i] *= 1 - lr * wd;
          m[k][i] = b1 * m[k][i] + (1 - b1) * gi;
          v[k][i] = b2 * v[k][i] + (1 - b2) * gi * gi;
          const double mh = m[k][i] / (1 - std::pow(b1, step));
          const double vh = v[k][i] / (1 - std::pow(b2, step));
          p[k][i] -= lr * mh / (std::sqrt(vh) + cfg.adam_eps);
        } else {
          const double d = gi + wd * p[k][i];
          m[k][i] = step == 1 ? d : cfg.sgd_momentum * m[k][i] + d;
          p[k][i] -= lr * m[k][i];
        }
      }
    }
    return norm;
  }
};

void ExpectMatchesReference(OptimizerType type, DType dtype, double tol) {
  ParameterList params = {MakeParam("w", {6, 5}, true, dtype, 1),
                          MakeParam("b", {5}, false, dtype, 2)};
  OptimizerConfig cfg;
  cfg.type = type;
  cfg.weight_decay = 0.1;
  cfg.clip_grad = 2.0;
  cfg.sgd_momentum = 0.9;
  auto opt = Optimizer::Create(params, cfg, {});
  ASSERT_TRUE(opt.ok()) << opt.status();
  Reference ref(params, cfg);
  bool clipped = false, unclipped = false;
  for (int s = 0; s < 4; ++s) {
    // Large gradients on even steps (clipped), small on odd ones.
    FillGrads(params, 10 + s, s % 2 == 0 ? 1.0f : 0.05f);
    const double lr = 0.01 * (s + 1);
    const double ref_norm = ref.Step(params, lr);
    auto info = (*opt)->Step(lr);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_FALSE(info->skipped);
    EXPECT_NEAR(info->grad_norm, ref_norm, 1e-6 * ref_norm);
    (ref_norm > cfg.clip_grad ? clipped : unclipped) = true;
  }
  EXPECT_TRUE(clipped && unclipped);
  auto states = (*opt)->StateTensors();
  for (size_t k = 0; k < params.size(); ++k) {
    // The fp32 main parameters against the reference.
    const Tensor* master = nullptr;
    for (const auto& s : states) {
      if (s.name == params[k]->name + ".main_param") master = &s.tensor;
    }
    ASSERT_NE(master, nullptr);
    const auto got = master->ToDoubles();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], ref.p[k][i], tol * (1 + std::abs(ref.p[k][i])))
          << params[k]->name << "[" << i << "]";
    }
    // The model's weights are the main parameters rounded to their dtype.
    const Tensor rounded = *master->To(dtype);
    EXPECT_EQ(rounded.ToDoubles(), params[k]->value.ToDoubles());
  }
}

TEST(OptimizerTest, AdamWMatchesFloat64Reference) {
  ExpectMatchesReference(OptimizerType::kAdam, DType::kFloat32, 2e-6);
}
TEST(OptimizerTest, SgdMomentumMatchesFloat64Reference) {
  ExpectMatchesReference(OptimizerType::kSgd, DType::kFloat32, 2e-6);
}
TEST(OptimizerTest, Bf16ParamsKeepFp32MainParams) {
  ExpectMatchesReference(OptimizerType::kAdam, DType::kBFloat16, 2e-6);
}
TEST(OptimizerTest, Fp16ParamsKeepFp32MainParams) {
  ExpectMatchesReference(OptimizerType::kSgd, DType::kFloat16, 2e-6);
}

TEST(OptimizerTest, NoWeightDecayOnBiasesAndNorms) {
  ParameterList params = {MakeParam("w", {4}, true, DType::kFloat32, 1),
                          MakeParam("norm", {4}, false, DType::kFloat32, 2)};
  const auto w0 = params[0]->value.ToDoubles();
  const auto n0 = params[1]->value.ToDoubles();
  OptimizerConfig cfg;
  cfg.weight_decay = 0.5;
  auto opt = *Optimizer::Create(params, cfg, {});
  ASSERT_TRUE(opt->Step(0.1).ok());  // Zero gradients: only decay acts.
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(params[0]->value.ToDoubles()[i], w0[i] * (1 - 0.05), 1e-6);
    EXPECT_EQ(params[1]->value.ToDoubles()[i], n0[i]);
  }
}

TEST(OptimizerTest, StateTensorsAreNamedPerParameter) {
  ParameterList params = {
      MakeParam("a.weight", {3, 2}, true, DType::kBFloat16, 1)};
  auto opt = *Optimizer::Create(params, OptimizerConfig(), {});
  auto states = opt->StateTensors();
  ASSERT_EQ(states.size(), 3u);
  EXPECT_EQ(states[0].name, "a.weight.main_param");
  EXPECT_EQ(states[1].name, "a.weight.exp_avg");
  EXPECT_EQ(states[2].name, "a.weight.exp_avg_sq");
  for (const auto& s : states) {
    EXPECT_EQ(s.offset, 0);
    EXPECT_EQ(s.tensor.numel(), 6);
    EXPECT_EQ(s.param_shape, (Shape{3, 2}));
  }
  EXPECT_EQ(opt->state_bytes(), 3 * 6 * 4);
}

TEST(OptimizerTest, CountsEachParameterOnce) {
  Parameter tp_split;
  tp_split.partition_dim = 0;
  Parameter replicated;
  Parameter tied;
  tied.partition_dim = 0;
  tied.shared_with_other_stage = true;
  EXPECT_TRUE(CountsInGradNorm(tp_split, 1, 0));
  EXPECT_TRUE(CountsInGradNorm(replicated, 0, 0));
  EXPECT_FALSE(CountsInGradNorm(replicated, 1, 0));
  EXPECT_TRUE(CountsInGradNorm(tied, 1, 0));
  EXPECT_FALSE(CountsInGradNorm(tied, 0, 1));
}

// --log-params-norm and the per-layer gradient norms against float64 sums
// over the same tensors (bound: fp32 elements summed in float64, then one
// fp32 hi/lo split: about 1e-7 relative).
TEST(OptimizerTest, ParamsNormAndGradNormsByGroup) {
  ParameterList params = {MakeParam("a", {3, 5}, true, DType::kFloat32, 1),
                          MakeParam("b", {7}, false, DType::kFloat32, 2),
                          MakeParam("c", {4, 2}, true, DType::kFloat32, 3)};
  FillGrads(params, 9, 0.5f);
  auto opt = *Optimizer::Create(params, OptimizerConfig(), OptimizerGroups());
  auto sum_sq = [](const Tensor& t) {
    double s = 0;
    for (double x : t.ToDoubles()) s += x * x;
    return s;
  };
  double all = 0;
  for (const auto& p : params) all += sum_sq(p->value);
  auto norm = opt->ParamsNorm();
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_NEAR(*norm, std::sqrt(all), 1e-6 * std::sqrt(all));

  // a and c in group 1, b in group 0; group 2 empty.
  auto norms = opt->GradNormsByGroup(
      3, [](const Parameter& p) { return p.name == "b" ? 0 : 1; });
  ASSERT_TRUE(norms.ok()) << norms.status();
  ASSERT_EQ(norms->size(), 3u);
  const double b = std::sqrt(sum_sq(params[1]->main_grad));
  const double ac =
      std::sqrt(sum_sq(params[0]->main_grad) + sum_sq(params[2]->main_grad));
  EXPECT_NEAR((*norms)[0], b, 1e-6 * b);
  EXPECT_NEAR((*norms)[1], ac, 1e-6 * ac);
  EXPECT_EQ((*norms)[2], 0.0);
  auto bad = opt->GradNormsByGroup(1, [](const Parameter&) { return 1; });
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'a'"), std::string::npos);
}

TEST(OptimizerTest, BadConfigNamesTheFlag) {
  ParameterList params = {MakeParam("w", {4}, true, DType::kFloat32, 1)};
  OptimizerConfig cfg;
  cfg.clip_grad = -1;
  auto opt = Optimizer::Create(params, cfg, {});
  ASSERT_FALSE(opt.ok());
  EXPECT_NE(opt.status().message().find("--clip-grad"), std::string::npos);
  cfg = OptimizerConfig();
  cfg.adam_beta2 = 1.0;
  opt = Optimizer::Create(params, cfg, {});
  ASSERT_FALSE(opt.ok());
  EXPECT_NE(opt.status().message().find("--adam-beta2"), std::string::npos);
  EXPECT_FALSE(ParseOptimizerType("lion").ok());
  EXPECT_EQ(*ParseOptimizerType("sgd"), OptimizerType::kSgd);
}

// fp16 weights on a quadratic, gradients scaled by the dynamic loss scale as
// backward would leave them; an inf injected at one step is skipped (weights
// unchanged, scale backed off) and training recovers.
TEST(OptimizerTest, Fp16LossScalerSkipsInjectedInfAndRecovers) {
  auto w = MakeParam("w", {64}, false, DType::kFloat16, 3);
  const std::vector<double> target(64, 0.25);
  OptimizerConfig cfg;
  cfg.type = OptimizerType::kSgd;
  cfg.sgd_momentum = 0.0;
  cfg.clip_grad = 0.0;
  cfg.loss_scaling = true;
  cfg.loss_scaler.initial_scale = 1024;
  cfg.loss_scaler.hysteresis = 1;
  cfg.loss_scaler.growth_interval = 3;
  auto opt = *Optimizer::Create({w}, cfg, {});
  auto loss = [&] {
    double l = 0;
    const auto v = w->value.ToDoubles();
    for (size_t i = 0; i < v.size(); ++i)
      l += 0.5 * (v[i] - target[i]) * (v[i] - target[i]);
    return l;
  };
  const double initial = loss();
  int skipped = 0;
  for (int s = 0; s < 12; ++s) {
    const double scale = opt->loss_scale();
    const auto v = w->value.ToDoubles();
    float* g = w->main_grad.data<float>();
    for (size_t i = 0; i < v.size(); ++i)
      g[i] = static_cast<float>(scale * (v[i] - target[i]));
    if (s == 4) g[7] = INFINITY;
    const auto before = w->value.ToDoubles();
    auto info = opt->Step(0.2);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->loss_scale, scale);
    if (s == 4) {
      EXPECT_TRUE(info->skipped);
      EXPECT_EQ(w->value.ToDoubles(), before);
      EXPECT_EQ(opt->loss_scale(), scale / 2);
      ++skipped;
    } else {
      EXPECT_FALSE(info->skipped) << "step " << s;
    }
  }
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(opt->step_count(), 11);
  // Grew twice (after steps 0-2 and 5-7, 8-10) and backed off once.
  EXPECT_EQ(opt->loss_scale(), 1024.0 * 2 / 2 * 2 * 2);
  EXPECT_LT(loss(), 0.01 * initial);
}

// Tiny GPT with the loss scaler (the model has no fp16 kernels, so it runs
// fp32 weights with fp16's scaler): the injected inf step is skipped and
// the run recovers to within a hair of an uninjected run one step shorter.
TEST(OptimizerTest, GptLossScalerSkipsInjectedInfStep) {
  testing::TrainOptions o;
  o.use_ddp = false;
  o.steps = 8;
  o.global_microbatches = 1;
  o.optimizer.loss_scaling = true;
  o.optimizer.loss_scaler.initial_scale = 65536;
  o.optimizer.loss_scaler.hysteresis = 1;
  o.lr.lr = 1e-3;
  o.lr.decay_style = LrDecayStyle::kConstant;
  o.inject_inf_steps = {3};
  auto r = testing::Train(o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  for (int s = 0; s < 8; ++s) {
    EXPECT_EQ(r->steps[s].skipped, s == 3) << s;
  }
  EXPECT_EQ(r->steps[4].loss_scale, 32768);
  EXPECT_LT(r->loss[7], r->loss[0]);
}

// 50 serial steps with warm-up and cosine decay: the 16-bit runs are
// compared with fp32 over them.
testing::TrainOptions FiftyStepOptions() {
  testing::TrainOptions o;
  o.use_ddp = false;
  o.steps = 50;
  o.global_microbatches = 1;
  o.lr.lr = 2e-3;
  o.lr.min_lr = 2e-4;
  o.lr.warmup_iters = 5;
  o.lr.decay_iters = 50;
  o.lr.decay_style = LrDecayStyle::kCosine;
  return o;
}

// bf16 weights and activations track the fp32 run within 2% over 50 steps.
TEST(OptimizerTest, Bf16GptTracksFp32) {
  testing::TrainOptions o = FiftyStepOptions();
  auto fp32 = testing::Train(o, nullptr);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  o.dtype = DType::kBFloat16;
  auto bf16 = testing::Train(o, nullptr);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  double worst = 0;
  for (int s = 0; s < 50; ++s) {
    worst = std::max(worst, testing::RelDiff(bf16->loss[s], fp32->loss[s]));
    EXPECT_FALSE(bf16->steps[s].skipped);
  }
  EXPECT_LE(worst, 0.02);
  // Training must actually move the loss for the comparison to mean much.
  EXPECT_LT(fp32->loss[49], 0.7 * fp32->loss[0]);
  std::printf(
      "bf16 vs fp32 over 50 steps: worst relative loss gap %.4f, "
      "loss %.4f -> %.4f (fp32) / %.4f (bf16)\n",
      worst, fp32->loss[0], fp32->loss[49], bf16->loss[49]);
}

// fp16 weights and activations with the dynamic loss scaler track the fp32
// run within 2% over 50 steps. The initial scale is 4096 rather than
// Megatron's 2^32, whose first steps overflow and are skipped by design
// (Fp16GptBacksOffFromOverflowingScale), which would shift the comparison.
TEST(OptimizerTest, Fp16GptTracksFp32) {
  testing::TrainOptions o = FiftyStepOptions();
  auto fp32 = testing::Train(o, nullptr);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  o.dtype = DType::kFloat16;
  o.optimizer.loss_scaling = true;
  o.optimizer.loss_scaler.initial_scale = 4096;
  auto fp16 = testing::Train(o, nullptr);
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  double worst = 0;
  for (int s = 0; s < 50; ++s) {
    worst = std::max(worst, testing::RelDiff(fp16->loss[s], fp32->loss[s]));
    EXPECT_FALSE(fp16->steps[s].skipped) << s;
    EXPECT_TRUE(std::isfinite(fp16->loss[s])) << s;
  }
  EXPECT_LE(worst, 0.02);
  EXPECT_LT(fp32->loss[49], 0.7 * fp32->loss[0]);
  std::printf(
      "fp16 vs fp32 over 50 steps: worst relative loss gap %.4f, "
      "loss %.4f -> %.4f (fp32) / %.4f (fp16)\n",
      worst, fp32->loss[0], fp32->loss[49], fp16->loss[49]);
}

// fp16 tiny GPT: an inf injected into the gradients at step 3 is skipped
// (scale halved with hysteresis 1) and training carries on.
TEST(OptimizerTest, Fp16GptSkipsInjectedInfAndRecovers) {
  testing::TrainOptions o;
  o.use_ddp = false;
  o.dtype = DType::kFloat16;
  o.steps = 10;
  o.global_microbatches = 1;
  o.optimizer.loss_scaling = true;
  o.optimizer.loss_scaler.initial_scale = 4096;
  o.optimizer.loss_scaler.hysteresis = 1;
  o.lr.lr = 1e-3;
  o.lr.decay_style = LrDecayStyle::kConstant;
  o.inject_inf_steps = {3};
  auto r = testing::Train(o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  for (int s = 0; s < 10; ++s) {
    EXPECT_EQ(r->steps[s].skipped, s == 3) << s;
    EXPECT_TRUE(std::isfinite(r->loss[s])) << s;
  }
  EXPECT_EQ(r->steps[3].loss_scale, 4096);
  EXPECT_EQ(r->steps[4].loss_scale, 2048);
  EXPECT_LT(r->loss[9], r->loss[0]);
}

// fp16 with a scale far too large for fp16 activation gradients (2^24): the
// first steps overflow for real (the scaled loss gradient exceeds 65504),
// are skipped while the scale halves, and then training proceeds.
TEST(OptimizerTest, Fp16GptBacksOffFromOverflowingScale) {
  testing::TrainOptions o;
  o.use_ddp = false;
  o.dtype = DType::kFloat16;
  o.steps = 16;
  o.global_microbatches = 1;
  o.optimizer.loss_scaling = true;
  o.optimizer.loss_scaler.initial_scale = 16777216;
  o.optimizer.loss_scaler.hysteresis = 1;
  o.lr.lr = 1e-3;
  o.lr.decay_style = LrDecayStyle::kConstant;
  auto r = testing::Train(o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  int skipped = 0;
  while (skipped < 16 && r->steps[skipped].skipped) ++skipped;
  EXPECT_GE(skipped, 1);
  EXPECT_LE(skipped, 10);
  for (int s = skipped; s < 16; ++s) {
    EXPECT_FALSE(r->steps[s].skipped) << s;
    EXPECT_TRUE(std::isfinite(r->loss[s])) << s;
  }
  EXPECT_EQ(r->steps[skipped].loss_scale, 16777216.0 / (1 << skipped));
  EXPECT_LT(r->loss[15], r->loss[skipped]);
  std::printf("fp16 from scale 2^24: %d steps skipped, scale then %.0f\n",
              skipped, r->steps[skipped].loss_scale);
}

}  // namespace
}  // namespace optim
}  // namespace mcc
