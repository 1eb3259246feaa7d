#include "models/moe/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace moe {
namespace {

constexpr double kU32 = 1.0 / (1 << 24);  // fp32 unit roundoff.

// ---- A dense float64 reference of the same computation -------------------

struct Weights {  // Row-major, as the layer's parameters.
  std::vector<double> x, wr, w1, w2, s1, s2, sg, bias;
};

double Sigmoid(double v) { return 1 / (1 + std::exp(-v)); }
double Silu(double v) { return v * Sigmoid(v); }
double SiluGrad(double v) { return Sigmoid(v) * (1 + v * (1 - Sigmoid(v))); }
double GeluOf(double v) {
  const double c = std::sqrt(2 / M_PI);
  return 0.5 * v * (1 + std::tanh(c * (v + 0.044715 * v * v * v)));
}
double GeluGrad(double v) {
  const double c = std::sqrt(2 / M_PI);
  const double t = std::tanh(c * (v + 0.044715 * v * v * v));
  return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v);
}

// Storage roundoff and the activation's relative error bound, per dtype:
// activation.cc bounds 1 / (1 + 2^t) by 2.71e-6 (fp32 outputs) or 7.55e-5
// (bf16 outputs) plus ln(2) |dt|; with the few fp32 products around it and
// |t| < 30 that stays under 1e-5 and 1e-4. GELU's 0.5 v (1 + tanh) turns an
// absolute error of tanh into 0.5 |v| times twice that bound, hence the
// |v| term for GELU.
struct Precision {
  double u_store;  // 0 for fp32 (its roundings are counted per operation).
  double act_rel;
};

// One expert MLP (fc1 [f1, h], fc2 [h, f]) on one token, with a first-order
// bound on the layer's error: y and its bound.
void ExpertRef(const double* x, const double* w1, const double* w2, int64_t h,
               int64_t f, bool swiglu, const Precision& p, double* y,
               double* bound) {
  const int64_t f1 = swiglu ? 2 * f : f;
  std::vector<double> a(f1), ea(f1), act(f), eact(f);
  for (int64_t i = 0; i < f1; ++i) {
    double s = 0, mag = 0;
    for (int64_t j = 0; j < h; ++j) {
      s += w1[i * h + j] * x[j];
      mag += std::fabs(w1[i * h + j] * x[j]);
    }
    a[i] = s;
    ea[i] = (h + 1) * kU32 * mag + p.u_store * std::fabs(s);
  }
  for (int64_t i = 0; i < f; ++i) {
    if (swiglu) {
      act[i] = Silu(a[i]) * a[f + i];
      eact[i] = std::fabs(a[f + i] * SiluGrad(a[i])) * ea[i] +
                std::fabs(Silu(a[i])) * ea[f + i] +
                (p.act_rel + p.u_store) * std::fabs(act[i]);
    } else {
      act[i] = GeluOf(a[i]);
      eact[i] = std::fabs(GeluGrad(a[i])) * ea[i] +
                p.act_rel * (std::fabs(act[i]) + std::fabs(a[i])) +
                p.u_store * std::fabs(act[i]);
    }
  }
  for (int64_t o = 0; o < h; ++o) {
    double s = 0, mag = 0, prop = 0;
    for (int64_t i = 0; i < f; ++i) {
      s += w2[o * f + i] * act[i];
      mag += std::fabs(w2[o * f + i] * act[i]);
      prop += std::fabs(w2[o * f + i]) * eact[i];
    }
    y[o] = s;
    bound[o] = prop + (f + 1) * kU32 * mag;
  }
}

struct RefOut {
  std::vector<double> y, bound;
  std::vector<int> choice;
  std::vector<double> slot_weight;  // Combine weight of slot r * k + i.
  double aux = 0, z = 0;
};

// choice: the experts to use (the kernel's, so finite differences do not
// jump between choices); empty: chosen here, by the stable descending sort.
// kept: per slot, whether it reaches its expert (empty: all do).
RefOut Reference(const MoeMlpConfig& c, const Weights& w, int64_t t,
                 int64_t sequences, const Precision& p,
                 const std::vector<int>& choice,
                 const std::vector<char>& kept = {}) {
  const int64_t h = c.hidden_size, e = c.num_experts, k = c.router.topk,
                f = c.ffn_hidden_size, fs = c.shared_expert_ffn_hidden_size;
  const bool swiglu = c.activation == ExpertActivation::kSwiGLU;
  const int64_t f1 = swiglu ? 2 * f : f;
  RefOut out;
  out.y.assign(t * h, 0);
  out.bound.assign(t * h, 0);
  std::vector<double> scores(t * e);
  std::vector<double> ey(h), eb(h);
  for (int64_t r = 0; r < t; ++r) {
    const double* x = w.x.data() + r * h;
    std::vector<double> l(e);
    double lerr = 0;
    for (int64_t j = 0; j < e; ++j) {
      double mag = 0;
      for (int64_t i = 0; i < h; ++i) {
        l[j] += x[i] * w.wr[j * h + i];
        mag += std::fabs(x[i] * w.wr[j * h + i]);
      }
      lerr = std::max(lerr, (h + 1) * kU32 * mag);
    }
    double mx = *std::max_element(l.begin(), l.end()), z = 0;
    for (int64_t j = 0; j < e; ++j) z += std::exp(l[j] - mx);
    out.z += std::pow(mx + std::log(z), 2) * c.z_loss_coeff / t;
    double* s = scores.data() + r * e;
    for (int64_t j = 0; j < e; ++j) {
      s[j] = c.router.score_function == ops::MoeScoreFunction::kSigmoid
                 ? Sigmoid(l[j])
                 : std::exp(l[j] - mx) / z;
    }
    std::vector<int> chosen;
    if (choice.empty()) {
      std::vector<int> order(e);
      std::iota(order.begin(), order.end(), 0);
      auto v = [&](int j) { return s[j] + (w.bias.empty() ? 0 : w.bias[j]); };
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return v(a) > v(b); });
      chosen.assign(order.begin(), order.begin() + k);
    } else {
      chosen.assign(choice.begin() + r * k, choice.begin() + (r + 1) * k);
    }
    out.choice.insert(out.choice.end(), chosen.begin(), chosen.end());
    double denom = 0;
    for (int i : chosen) denom += s[i];
    double* y = out.y.data() + r * h;
    double* yb = out.bound.data() + r * h;
    std::vector<double> mag(h, 0);
    for (int64_t ci = 0; ci < k; ++ci) {
      const int i = chosen[ci];
      const double wt = c.router.scaling_factor *
                        (c.router.normalize_topk ? s[i] / denom : s[i]);
      out.slot_weight.push_back(wt);
      if (!kept.empty() && !kept[r * k + ci]) continue;
      // The router's fp32 error (moe_router_test's bound) and its logits'
      // error through the softmax or sigmoid (|dw/dl| <= 2 w).
      const double werr = wt * ((e + k + 8) * 2 * kU32 + 2 * lerr);
      ExpertRef(x, w.w1.data() + i * f1 * h, w.w2.data() + i * h * f, h, f,
                swiglu, p, ey.data(), eb.data());
      for (int64_t o = 0; o < h; ++o) {
        y[o] += wt * ey[o];
        yb[o] += wt * eb[o] + werr * std::fabs(ey[o]);
        mag[o] += std::fabs(wt * ey[o]);
      }
    }
    for (int64_t o = 0; o < h; ++o) {
      yb[o] += (k + 1) * kU32 * mag[o] + p.u_store * std::fabs(y[o]);
    }
    if (fs > 0) {
      ExpertRef(x, w.s1.data(), w.s2.data(), h, fs, swiglu, p, ey.data(),
                eb.data());
      // Qwen2-MoE's gate sigmoid(x . w_g): its fp32 logit's error through
      // the sigmoid (slope <= 1/4), and the gated output's own rounding.
      double gate = 1, gerr = 0;
      if (c.shared_expert_gate) {
        double l = 0, mag = 0;
        for (int64_t i = 0; i < h; ++i) {
          l += x[i] * w.sg[i];
          mag += std::fabs(x[i] * w.sg[i]);
        }
        gate = Sigmoid(l);
        gerr = 0.25 * (h + 1) * kU32 * mag + 4 * kU32 + p.u_store;
      }
      for (int64_t o = 0; o < h; ++o) {
        y[o] += gate * ey[o];
        yb[o] += gate * eb[o] + gerr * std::fabs(ey[o]) +
                 p.u_store * std::fabs(y[o]);
      }
    }
  }
  // Balancing loss over sequences g = r % sequences.
  const bool seq = c.load_balancing == LoadBalancing::kSeqAuxLoss;
  const int64_t groups = seq ? sequences : 1, len = t / groups;
  if (c.load_balancing != LoadBalancing::kNone) {
    for (int64_t g = 0; g < groups; ++g) {
      std::vector<double> cnt(e, 0), pm(e, 0);
      for (int64_t r = g; r < t; r += groups) {
        double zs = 0;
        for (int64_t j = 0; j < e; ++j) zs += scores[r * e + j];
        for (int64_t j = 0; j < e; ++j) {
          pm[j] += (c.router.score_function == ops::MoeScoreFunction::kSigmoid
                        ? scores[r * e + j] / zs
                        : scores[r * e + j]) /
                   len;
        }
        for (int64_t i = 0; i < k; ++i) cnt[out.choice[r * k + i]] += 1;
      }
      for (int64_t j = 0; j < e; ++j) {
        out.aux += c.aux_loss_coeff * e * cnt[j] / (len * k) * pm[j] / groups;
      }
    }
  }
  return out;
}

Weights WeightsOf(const MoeMlp& m, const Tensor& x) {
  Weights w;
  w.x = x.ToDoubles();
  w.wr = m.router_weight().value.ToDoubles();
  w.w1 = m.fc1_weight().value.ToDoubles();
  w.w2 = m.fc2_weight().value.ToDoubles();
  if (m.shared_fc1_weight() != nullptr) {
    w.s1 = m.shared_fc1_weight()->value.ToDoubles();
    w.s2 = m.shared_fc2_weight()->value.ToDoubles();
  }
  if (m.shared_gate_weight() != nullptr) {
    w.sg = m.shared_gate_weight()->value.ToDoubles();
  }
  if (m.expert_bias().defined()) w.bias = m.expert_bias().ToDoubles();
  return w;
}

std::vector<int> Ints(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int>(p, p + t.numel());
}

MoeMlpConfig SmallConfig(DType dtype) {
  MoeMlpConfig c;
  c.hidden_size = 16;
  c.num_experts = 8;
  c.ffn_hidden_size = 8;
  c.shared_expert_ffn_hidden_size = 12;
  c.router.topk = 2;
  c.load_balancing = LoadBalancing::kSeqAuxLoss;
  c.aux_loss_coeff = 0.1f;
  c.z_loss_coeff = 0.01f;
  c.expert_bias = true;
  c.dtype = dtype;
  c.init_std = 0.3f;
  return c;
}

Tensor RandomInput(int64_t t, int64_t h, DType dtype, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(t * h);
  for (float& x : v) x = dist(gen);
  return Tensor::FromVector(v, {t, h}, dtype).value();
}

struct ForwardCase {
  DType dtype;
  ExpertActivation activation;
  ops::MoeScoreFunction score;
  // Qwen2-MoE's choices: the shared expert's sigmoid gate and top-k
  // softmax probabilities not renormalised.
  bool qwen2_moe = false;
};

class MoeMlpForwardTest : public ::testing::TestWithParam<ForwardCase> {};

// The layer's output within a first-order error bound of the float64
// reference, propagated stage by stage beside it (ExpertRef, Reference):
// each GEMM adds (K + 1) u32 sum |terms| and each stored 16-bit tensor
// u_bf16 |value|; errors pass on through |derivatives|. Terms of second
// order are below 2^-8 of the first-order ones; the factor 1.5 covers them.
TEST_P(MoeMlpForwardTest, WithinTheErrorBoundOfFloat64) {
  const ForwardCase fc = GetParam();
  MoeMlpConfig c = SmallConfig(fc.dtype);
  c.activation = fc.activation;
  c.router.score_function = fc.score;
  c.shared_expert_gate = fc.qwen2_moe;
  c.router.normalize_topk = !fc.qwen2_moe;
  auto m = MoeMlp::Create("mlp", c).value();
  ASSERT_TRUE(m->UpdateExpertBias({9, 1, 5, 5, 5, 5, 5, 5}, 0.05f).ok());
  const int64_t t = 24, b = 3;
  Tensor x = RandomInput(t, c.hidden_size, c.dtype, 7);
  MoeMlp::Activations act;
  Tensor y = m->Forward(x, b, &act).value();
  const Precision p = fc.dtype == DType::kBFloat16
                          ? Precision{std::ldexp(1.0, -8), 1e-4}
                          : Precision{0.0, 1e-5};
  const RefOut ref = Reference(c, WeightsOf(*m, x), t, b, p, {});
  EXPECT_EQ(Ints(act.indices), ref.choice);
  const std::vector<double> got = y.ToDoubles();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], ref.y[i], 1.5 * ref.bound[i]) << "y[" << i << "]";
  }
  // The losses: fp32 router arithmetic (moe_router_test's bounds), on
  // logits within (h + 1) u32 sum |x w| of the reference's.
  EXPECT_NEAR(act.aux_loss.ToDoubles()[0], ref.aux, 1e-5 * ref.aux);
  EXPECT_NEAR(act.z_loss.ToDoubles()[0], ref.z, 1e-5 * ref.z);
  int64_t routed = 0;
  for (int64_t n : act.tokens_per_expert) routed += n;
  EXPECT_EQ(routed, t * c.router.topk);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MoeMlpForwardTest,
    ::testing::Values(ForwardCase{DType::kFloat32, ExpertActivation::kSwiGLU,
                                  ops::MoeScoreFunction::kSoftmax},
                      ForwardCase{DType::kFloat32, ExpertActivation::kGelu,
                                  ops::MoeScoreFunction::kSigmoid},
                      ForwardCase{DType::kBFloat16, ExpertActivation::kSwiGLU,
                                  ops::MoeScoreFunction::kSoftmax},
                      ForwardCase{DType::kBFloat16, ExpertActivation::kGelu,
                                  ops::MoeScoreFunction::kSigmoid},
                      ForwardCase{DType::kFloat32, ExpertActivation::kSwiGLU,
                                  ops::MoeScoreFunction::kSoftmax, true},
                      ForwardCase{DType::kBFloat16, ExpertActivation::kSwiGLU,
                                  ops::MoeScoreFunction::kSoftmax, true}));

// Every gradient of L = <dy, y> + g (aux + z) against central differences
// of the float64 reference (choices held at the kernel's). The fp32 layer's
// gradients pass through at most 6 stages of fp32 sums of at most 49 terms
// (t k = 48 rows in the weight gradients): a componentwise error of at most
// 6 * 49 u32 (1.8e-5) of the sums of absolute terms; on these unit-scale
// random inputs those sums stay within a few times the largest gradient of
// the tensor, so each tensor is compared norm-wise, to 1e-4 of its largest
// entry. Differences with h = 1e-6 of a float64 function are good to ~1e-9.
void CheckGradients(DType dtype, double rel_tol, double capacity_factor = 0,
                    TokenDropPolicy policy = TokenDropPolicy::kProbs,
                    bool qwen2_moe = false) {
  MoeMlpConfig c = SmallConfig(dtype);
  c.capacity_factor = capacity_factor;
  c.drop_policy = policy;
  c.shared_expert_gate = qwen2_moe;
  c.router.normalize_topk = !qwen2_moe;
  auto m = MoeMlp::Create("mlp", c).value();
  ASSERT_TRUE(m->UpdateExpertBias({9, 1, 5, 5, 5, 5, 5, 5}, 0.05f).ok());
  const int64_t t = 24, b = 3;
  const float g = 2.0f;
  Tensor x = RandomInput(t, c.hidden_size, c.dtype, 8);
  Tensor dy = RandomInput(t, c.hidden_size, c.dtype, 9);
  MoeMlp::Activations act;
  ASSERT_TRUE(m->Forward(x, b, &act).ok());
  Tensor dx = m->Backward(dy, act, g).value();
  const std::vector<int> choice = Ints(act.indices);
  // The layer's dropped slots, held fixed as the choices are.
  std::vector<char> kept;
  for (double v : act.dispatch_weights.ToDoubles()) kept.push_back(v != 0);
  const std::vector<double> dyd = dy.ToDoubles();
  const Precision p{0.0, 0.0};
  Weights w0 = WeightsOf(*m, x);
  auto objective = [&](const Weights& w) {
    const RefOut r = Reference(c, w, t, b, p, choice, kept);
    double v = 0;
    for (size_t i = 0; i < dyd.size(); ++i) v += dyd[i] * r.y[i];
    return v + g * (r.aux + r.z);
  };
  auto check = [&](std::vector<double> Weights::*field, const Tensor& got,
                   const char* what) {
    Weights w = w0;
    std::vector<double>& v = w.*field;
    std::vector<double> fd(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const double v0 = v[i];
      v[i] = v0 + 1e-6;
      const double lp = objective(w);
      v[i] = v0 - 1e-6;
      const double lm = objective(w);
      v[i] = v0;
      fd[i] = (lp - lm) / 2e-6;
    }
    const std::vector<double> gd = got.ToDoubles();
    double scale = 0;
    for (double d : fd) scale = std::max(scale, std::fabs(d));
    ASSERT_GT(scale, 0) << what;
    double worst = 0;
    for (size_t i = 0; i < fd.size(); ++i) {
      ASSERT_NEAR(gd[i], fd[i], rel_tol * scale) << what << "[" << i << "]";
      worst = std::max(worst, std::fabs(gd[i] - fd[i]) / scale);
    }
    std::printf("%s %s: largest difference %.3g of the largest entry\n",
                DTypeName(dtype).data(), what, worst);
  };
  check(&Weights::x, dx, "dx");
  check(&Weights::wr, m->router_weight().main_grad, "router");
  check(&Weights::w1, m->fc1_weight().main_grad, "fc1");
  check(&Weights::w2, m->fc2_weight().main_grad, "fc2");
  check(&Weights::s1, m->shared_fc1_weight()->main_grad, "shared fc1");
  check(&Weights::s2, m->shared_fc2_weight()->main_grad, "shared fc2");
  if (qwen2_moe) {
    check(&Weights::sg, m->shared_gate_weight()->main_grad, "shared gate");
  }
}

TEST(MoeMlpBackwardTest, GradientsMatchFiniteDifferencesOfFloat64) {
  CheckGradients(DType::kFloat32, 1e-4);
}

// bf16: the same check against the reference on the bf16-rounded weights and
// inputs. A gradient passes through at most 9 tensors stored in bf16 (the
// forward's fc1_out, act_out, expert_out; the backward's dexpert_out, dact,
// dfc1, dpermuted, dx_experts, dx), each rounded to 2^-8 relative: 9 * 2^-8
// = 3.5% of the sums of absolute terms, compared norm-wise (with the same
// allowance for cancellation as in fp32) to 8% of the largest entry.
// Qwen2-MoE: the gate's gradient, and the others' through it and through
// the unnormalised combine weights.
TEST(MoeMlpBackwardTest, GatedSharedExpertGradientsMatchFiniteDifferences) {
  CheckGradients(DType::kFloat32, 1e-4, 0, TokenDropPolicy::kProbs, true);
}

TEST(MoeMlpBackwardTest, Bf16GradientsMatchFiniteDifferencesOfFloat64) {
  CheckGradients(DType::kBFloat16, 0.08);
}

// DeepSeek-V3's bias evens out a router skewed toward expert 0.
TEST(MoeMlpTest, ExpertBiasEvensOutASkewedRouter) {
  MoeMlpConfig c = SmallConfig(DType::kFloat32);
  c.shared_expert_ffn_hidden_size = 0;
  c.router.score_function = ops::MoeScoreFunction::kSigmoid;
  auto m = MoeMlp::Create("mlp", c).value();
  // Skew: every token's logit for expert 0 raised by 2.
  Tensor& wr = m->router_weight().value;
  float* p = wr.data<float>();
  for (int64_t i = 0; i < c.hidden_size; ++i) p[i] += 0.5f;
  Tensor x = RandomInput(256, c.hidden_size, c.dtype, 10);
  float* xp = x.data<float>();
  for (int64_t r = 0; r < 256; ++r) {
    for (int64_t i = 0; i < c.hidden_size; ++i) {
      xp[r * c.hidden_size + i] = std::fabs(xp[r * c.hidden_size + i]);
    }
  }
  auto max_share = [&]() {
    MoeMlp::Activations act;
    EXPECT_TRUE(m->Forward(x, 1, &act).ok());
    const int64_t mx = *std::max_element(act.tokens_per_expert.begin(),
                                         act.tokens_per_expert.end());
    return std::make_pair(static_cast<double>(mx) / (256 * 2 / 8),
                          act.tokens_per_expert);
  };
  const double before = max_share().first;
  for (int step = 0; step < 50; ++step) {
    ASSERT_TRUE(m->UpdateExpertBias(max_share().second, 0.01f).ok());
  }
  const double after = max_share().first;
  // Expert 0 starts with every token (4x the mean load); after 50 steps of
  // 0.01 the most loaded expert carries under 1.5x the mean.
  EXPECT_GT(before, 3.5);
  EXPECT_LT(after, 1.5);
}

// ---- Capacity and token dropping ----------------------------------------

// The float64 reference's dropping: capacity ceil(t k / E * factor); per
// expert the slots of largest reference weight (equal: the lower token) or
// the first tokens keep their place.
std::vector<char> ReferenceKept(const RefOut& r, int64_t t, int64_t k,
                                int64_t e, double factor,
                                TokenDropPolicy policy) {
  const int64_t cap =
      static_cast<int64_t>(std::ceil(static_cast<double>(t * k) / e * factor));
  std::vector<char> kept(t * k, 1);
  for (int64_t ex = 0; ex < e; ++ex) {
    std::vector<int64_t> slots;
    for (int64_t s = 0; s < t * k; ++s) {
      if (r.choice[s] == ex) slots.push_back(s);
    }
    if (policy == TokenDropPolicy::kProbs) {
      std::stable_sort(slots.begin(), slots.end(), [&](int64_t a, int64_t b) {
        return r.slot_weight[a] > r.slot_weight[b];
      });
    }
    for (size_t i = cap; i < slots.size(); ++i) kept[slots[i]] = 0;
  }
  return kept;
}

class MoeMlpCapacityTest : public ::testing::TestWithParam<TokenDropPolicy> {};

// With capacity 3 per expert (factor 0.5, 48 slots, 8 experts, one expert
// favoured by its bias) the layer drops the reference's slots and its output
// is within the forward test's bound of the float64 reference without them.
TEST_P(MoeMlpCapacityTest, DropsTheReferencesSlotsAndMatchesIt) {
  MoeMlpConfig c = SmallConfig(DType::kFloat32);
  c.capacity_factor = 0.5;
  c.drop_policy = GetParam();
  auto m = MoeMlp::Create("mlp", c).value();
  ASSERT_TRUE(m->UpdateExpertBias({9, 1, 5, 5, 5, 5, 5, 5}, 0.05f).ok());
  const int64_t t = 24, b = 3, k = c.router.topk;
  Tensor x = RandomInput(t, c.hidden_size, c.dtype, 7);
  MoeMlp::Activations act;
  Tensor y = m->Forward(x, b, &act).value();
  const Precision p{0.0, 1e-5};
  const Weights w = WeightsOf(*m, x);
  const RefOut full = Reference(c, w, t, b, p, {});
  const std::vector<char> kept =
      ReferenceKept(full, t, k, c.num_experts, c.capacity_factor, GetParam());
  const RefOut ref = Reference(c, w, t, b, p, {}, kept);
  const std::vector<double> dw = act.dispatch_weights.ToDoubles();
  const std::vector<double> rw = act.weights.ToDoubles();
  int64_t kept_count = 0;
  for (int64_t s = 0; s < t * k; ++s) {
    EXPECT_EQ(dw[s] != 0, kept[s] != 0) << "slot " << s;
    EXPECT_EQ(dw[s], kept[s] ? rw[s] : 0.0) << "slot " << s;
    kept_count += kept[s];
  }
  EXPECT_LT(kept_count, t * k);  // The case drops something.
  EXPECT_EQ(act.kept_rows, kept_count);
  for (int64_t n : act.tokens_per_expert) EXPECT_LE(n, 3);
  const std::vector<double> got = y.ToDoubles();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], ref.y[i], 1.5 * ref.bound[i]) << "y[" << i << "]";
  }
}

// Gradients with dropped slots against central differences of the float64
// reference without them (the dropless test's tolerance).
TEST_P(MoeMlpCapacityTest, GradientsMatchFiniteDifferencesOfFloat64) {
  CheckGradients(DType::kFloat32, 1e-4, 0.5, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Policies, MoeMlpCapacityTest,
                         ::testing::Values(TokenDropPolicy::kProbs,
                                           TokenDropPolicy::kPosition));

// A token dropped by every expert it chose contributes exactly zero and
// takes exactly zero gradient (no shared expert, no losses).
TEST(MoeMlpCapacityTest, FullyDroppedTokensContributeZero) {
  MoeMlpConfig c = SmallConfig(DType::kFloat32);
  c.shared_expert_ffn_hidden_size = 0;
  c.aux_loss_coeff = 0;
  c.z_loss_coeff = 0;
  c.capacity_factor = 0.1;  // Capacity 1 of 48 slots over 8 experts.
  c.drop_policy = TokenDropPolicy::kPosition;
  auto m = MoeMlp::Create("mlp", c).value();
  const int64_t t = 24, h = c.hidden_size, k = c.router.topk;
  Tensor x = RandomInput(t, h, c.dtype, 5);
  Tensor dy = RandomInput(t, h, c.dtype, 6);
  MoeMlp::Activations act;
  const std::vector<double> y = m->Forward(x, 1, &act).value().ToDoubles();
  const std::vector<double> dx = m->Backward(dy, act).value().ToDoubles();
  const std::vector<double> dw = act.dispatch_weights.ToDoubles();
  int fully_dropped = 0;
  for (int64_t r = 0; r < t; ++r) {
    bool any = false;
    for (int64_t i = 0; i < k; ++i) any |= dw[r * k + i] != 0;
    if (any) continue;
    ++fully_dropped;
    for (int64_t j = 0; j < h; ++j) {
      EXPECT_EQ(y[r * h + j], 0.0) << r;
      EXPECT_EQ(dx[r * h + j], 0.0) << r;
    }
  }
  EXPECT_GE(fully_dropped, 24 - 8);  // At most 8 slots are kept.
}

TEST(MoeMlpTest, ForwardIsBitIdenticalOnARerun) {
  MoeMlpConfig c = SmallConfig(DType::kBFloat16);
  auto m = MoeMlp::Create("mlp", c).value();
  Tensor x = RandomInput(48, c.hidden_size, c.dtype, 11);
  MoeMlp::Activations a1, a2;
  const std::vector<double> y1 = m->Forward(x, 4, &a1).value().ToDoubles();
  const std::vector<double> y2 = m->Forward(x, 4, &a2).value().ToDoubles();
  EXPECT_EQ(y1, y2);
}

TEST(MoeMlpTest, BadConfigsAreRefusedByName) {
  MoeMlpConfig c = SmallConfig(DType::kFloat32);
  c.router.topk = 9;
  auto m = MoeMlp::Create("mlp", c);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("topk 9 must be in [1, 8]"),
            std::string::npos)
      << m.status();
}

TEST(MoeMlpTest, AGateWithoutASharedExpertIsRefused) {
  MoeMlpConfig c = SmallConfig(DType::kFloat32);
  c.shared_expert_ffn_hidden_size = 0;
  c.shared_expert_gate = true;
  auto m = MoeMlp::Create("mlp", c);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("gate needs a shared expert"),
            std::string::npos)
      << m.status();
}

}  // namespace
}  // namespace moe
}  // namespace mcc
