// The GPT model against itself: serial gradients against finite
// differences, and every tensor/sequence-parallel layout (real processes
// over gloo) against the serial run.
#include "models/gpt/gpt_model.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "parallel/mappings.h"

namespace mcc {
namespace gpt {
namespace {

GPTConfig TinyConfig() {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 128;
  c.seq_length = 16;
  c.seed = 7;
  return c;
}

constexpr int64_t kBatch = 2;

MicroBatch FixedBatch(const GPTConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> tokens(kBatch * c.seq_length);
  std::vector<int64_t> labels(tokens.size());
  for (auto& t : tokens) t = rng() % c.vocab_size;
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i] =
        (i % 7 == 3) ? -100 : static_cast<int64_t>(rng() % c.vocab_size);
  }
  MicroBatch b;
  b.tokens = *Tensor::FromInts(tokens, {kBatch, c.seq_length});
  b.labels = *Tensor::FromInts(labels, {kBatch, c.seq_length});
  return b;
}

// The variants every layout runs: name -> config change.
std::vector<std::pair<std::string, GPTConfig>> Variants() {
  std::vector<std::pair<std::string, GPTConfig>> v;
  GPTConfig base = TinyConfig();
  v.push_back({"plain", base});
  GPTConfig sel = base;
  sel.recompute_granularity = RecomputeGranularity::kSelective;
  v.push_back({"selective", sel});
  GPTConfig full = base;
  full.recompute_granularity = RecomputeGranularity::kFull;
  full.recompute_num_layers = 2;
  v.push_back({"full_uniform", full});
  GPTConfig block = full;
  block.recompute_method = RecomputeMethod::kBlock;
  block.recompute_num_layers = 1;
  v.push_back({"full_block", block});
  GPTConfig rope = base;
  rope.position_embedding = PositionEmbedding::kRope;
  rope.normalization = Normalization::kRMSNorm;
  rope.untie_embeddings_and_output_weights = true;
  rope.hidden_dropout = 0.1;
  rope.attention_dropout = 0.1;
  v.push_back({"rope_rmsnorm_untied_dropout", rope});
  GPTConfig swiglu = base;
  swiglu.activation = Activation::kSwiGLU;
  swiglu.ffn_hidden_size = 96;
  v.push_back({"swiglu", swiglu});
  // The Llama architecture: every TP layout splits the 4 K/V groups of its
  // 8 query heads, with rotary positions on sequence-parallel activations.
  GPTConfig llama = base;
  llama.num_attention_heads = 8;
  llama.normalization = Normalization::kRMSNorm;
  llama.activation = Activation::kSwiGLU;
  llama.ffn_hidden_size = 96;
  llama.position_embedding = PositionEmbedding::kRope;
  llama.num_query_groups = 4;
  llama.untie_embeddings_and_output_weights = true;
  llama.add_bias_linear = false;
  v.push_back({"llama", llama});
  GPTConfig llama_sel = llama;
  llama_sel.recompute_granularity = RecomputeGranularity::kSelective;
  llama_sel.hidden_dropout = 0.1;
  llama_sel.attention_dropout = 0.1;
  v.push_back({"llama_selective_dropout", llama_sel});
  // Llama 3.x's rotary scaling: an original context of 8 positions puts the
  // 8 frequencies of head_dim 16 in all three bands.
  GPTConfig llama3 = llama;
  llama3.rope_scaling.enabled = true;
  llama3.rope_scaling.factor = 8.0;
  llama3.rope_scaling.original_max_position_embeddings = 8;
  v.push_back({"llama3_rope_scaling", llama3});
  // Qwen2: the QKV projection alone has a bias, split with its rows.
  GPTConfig qwen2 = llama;
  qwen2.add_qkv_bias = true;
  v.push_back({"qwen2_qkv_bias", qwen2});
  // Qwen3: Q and K normalised per head before the rotation; each TP rank
  // holds its heads, so the norm weights' gradients sum over TP.
  GPTConfig qwen3 = llama;
  qwen3.qk_layernorm = true;
  v.push_back({"qwen3_qk_layernorm", qwen3});
  GPTConfig qwen3_sel = qwen3;
  qwen3_sel.recompute_granularity = RecomputeGranularity::kSelective;
  v.push_back({"qwen3_qk_layernorm_selective", qwen3_sel});
  // Padding that differs with TP: 128 rows at TP 1 and 2, 256 at TP 4
  // (where ranks 2 and 3 hold padding only).
  GPTConfig padded = base;
  padded.vocab_size = 100;
  padded.make_vocab_size_divisible_by = 64;
  padded.untie_embeddings_and_output_weights = true;
  v.push_back({"padded_vocab_untied", padded});
  return v;
}

// Loss and full (gathered) gradients of one run, in parameter order.
struct RunResult {
  double loss = 0;
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads;
};

absl::StatusOr<RunResult> RunModel(const GPTConfig& config,
                                   comm::ProcessGroup* tp, bool sp) {
  parallel::LayerContext ctx;
  ctx.tp_group = tp;
  ctx.sequence_parallel = sp;
  ctx.seed = config.seed;
  MCC_ASSIGN_OR_RETURN(auto model, GPTModel::Create(config, ctx));
  RunResult result;
  // Two micro-batches accumulate, as in training.
  for (uint32_t mb = 0; mb < 2; ++mb) {
    MCC_ASSIGN_OR_RETURN(LossSum loss, model->ForwardBackward(
                                           FixedBatch(config, 11 + mb), 0.5f));
    result.loss += loss.mean() / 2;
  }
  MCC_RETURN_IF_ERROR(model->FinalizeGradients());
  for (const auto& p : model->parameters()) {
    Tensor g = p->main_grad, w = p->value;
    if (p->partition_dim >= 0) {
      MCC_ASSIGN_OR_RETURN(g,
                           parallel::GatherAlongDim(tp, g, p->partition_dim));
      MCC_ASSIGN_OR_RETURN(w,
                           parallel::GatherAlongDim(tp, w, p->partition_dim));
    }
    std::vector<float> grad = g.ToFloats();
    if (p->unpadded_rows >= 0) {
      // The vocabulary padding is zero and gets no gradient; the rest is
      // the model, the same under any padding.
      const size_t keep = p->unpadded_rows * (g.numel() / g.size(0));
      const std::vector<float> value = w.ToFloats();
      for (size_t i = keep; i < grad.size(); ++i) {
        if (grad[i] != 0.0f || value[i] != 0.0f) {
          return absl::InternalError(absl::StrCat(p->name, ": padding element ",
                                                  i, " holds ", value[i],
                                                  " with gradient ", grad[i]));
        }
      }
      grad.resize(keep);
    }
    result.names.push_back(p->name);
    result.grads.push_back(std::move(grad));
  }
  return result;
}

std::string ResultPath(int tp, bool sp, const std::string& variant) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/gpt_tp", tp, "_sp", sp, "_",
                      variant, ".bin");
}

void WriteResult(const std::string& path, const RunResult& r) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&r.loss), sizeof(r.loss));
  const int64_t n = r.grads.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof(n));
  for (const auto& g : r.grads) {
    const int64_t m = g.size();
    out.write(reinterpret_cast<const char*>(&m), sizeof(m));
    out.write(reinterpret_cast<const char*>(g.data()), m * sizeof(float));
  }
}

bool ReadResult(const std::string& path, RunResult* r) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  int64_t n = 0;
  in.read(reinterpret_cast<char*>(&r->loss), sizeof(r->loss));
  in.read(reinterpret_cast<char*>(&n), sizeof(n));
  r->grads.resize(n);
  for (auto& g : r->grads) {
    int64_t m = 0;
    in.read(reinterpret_cast<char*>(&m), sizeof(m));
    g.resize(m);
    in.read(reinterpret_cast<char*>(g.data()), m * sizeof(float));
  }
  return static_cast<bool>(in);
}

MCC_WORKER(gpt_parity) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    std::fprintf(stderr, "init: %s\n", world.status().ToString().c_str());
    return 3;
  }
  const bool sp = std::getenv("MCC_TEST_SP")[0] == '1';
  const int tp = world->group->size();
  for (const auto& [name, config] : Variants()) {
    auto result = RunModel(config, world->group.get(), sp);
    if (!result.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(),
                   result.status().ToString().c_str());
      return 4;
    }
    if (world->group->rank() == 0)
      WriteResult(ResultPath(tp, sp, name), *result);
  }
  return 0;
}

// Relative error of a against b, measured in b's norm.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff +=
        (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
  }
  return ref == 0 ? std::sqrt(diff) : std::sqrt(diff / ref);
}

class GPTParityTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(GPTParityTest, EqualsSerial) {
  const auto [tp, sp] = GetParam();
  auto results = comm::testing::RunWorkers(
      tp, "gpt_parity", absl::Seconds(120), [sp = sp](int) {
        return std::map<std::string, std::string>{
            {"MCC_TEST_SP", sp ? "1" : "0"}};
      });
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  for (const auto& [name, config] : Variants()) {
    SCOPED_TRACE(name);
    auto serial = RunModel(config, nullptr, false);
    ASSERT_TRUE(serial.ok()) << serial.status();
    RunResult parallel;
    ASSERT_TRUE(ReadResult(ResultPath(tp, sp, name), &parallel));
    EXPECT_NEAR(parallel.loss, serial->loss, 1e-5 * std::abs(serial->loss));
    ASSERT_EQ(parallel.grads.size(), serial->grads.size());
    for (size_t i = 0; i < serial->grads.size(); ++i) {
      ASSERT_EQ(parallel.grads[i].size(), serial->grads[i].size())
          << serial->names[i];
      EXPECT_LE(RelativeError(parallel.grads[i], serial->grads[i]), 1e-4)
          << serial->names[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GPTParityTest,
    ::testing::Values(std::make_tuple(1, false), std::make_tuple(2, false),
                      std::make_tuple(2, true), std::make_tuple(4, false),
                      std::make_tuple(4, true)),
    [](const auto& info) {
      return absl::StrCat("tp", std::get<0>(info.param),
                          std::get<1>(info.param) ? "_sp" : "");
    });

// The split backward (parallel/model.h): B leaves the linear layers' and
// embeddings' gradients and the grad-ready hooks for W, and B, B, W, W over
// two micro-batches leaves BackwardStep's gradients bit for bit.
TEST(GPTModelTest, SplitBackwardEqualsBackwardStepBitForBit) {
  for (const auto& [name, config] : Variants()) {
    parallel::LayerContext ctx;
    ctx.seed = config.seed;
    auto whole = GPTModel::Create(config, ctx);
    auto split = GPTModel::Create(config, ctx);
    ASSERT_TRUE(whole.ok() && split.ok()) << name;
    auto batches = std::make_shared<std::vector<MicroBatch>>();
    for (uint32_t mb = 0; mb < 2; ++mb) {
      batches->push_back(FixedBatch(config, 11 + mb));
    }
    (*whole)->SetMicroBatches(batches);
    (*split)->SetMicroBatches(batches);
    int reported = 0;
    (*split)->AddGradReadyHook(
        [&reported](const std::vector<Parameter*>& ready) {
          reported += static_cast<int>(ready.size());
          return absl::OkStatus();
        });
    std::vector<std::unique_ptr<parallel::ActivationRecord>> records;
    for (int mb = 0; mb < 2; ++mb) {
      auto a = (*whole)->ForwardStep(mb, Tensor(), true);
      ASSERT_TRUE(a.ok()) << name << ": " << a.status();
      ASSERT_TRUE(
          (*whole)->BackwardStep(Tensor(), 0.5f, std::move(a->record)).ok());
      auto b = (*split)->ForwardStep(mb, Tensor(), true);
      ASSERT_TRUE(b.ok()) << name << ": " << b.status();
      records.push_back(std::move(b->record));
    }
    for (auto& record : records) {
      auto dx = (*split)->BackwardInputStep(Tensor(), 0.5f, &record);
      ASSERT_TRUE(dx.ok()) << name << ": " << dx.status();
      ASSERT_NE(record, nullptr) << name;
    }
    EXPECT_EQ(reported, 0) << name;
    // The first layer's QKV weight gets its gradient only in W.
    const auto& params = (*split)->parameters();
    int checked = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i]->name.find("layers.0.") == std::string::npos ||
          params[i]->name.find("qkv.weight") == std::string::npos) {
        continue;
      }
      ++checked;
      for (float g : params[i]->main_grad.ToFloats()) {
        ASSERT_EQ(g, 0.0f) << name << " " << params[i]->name;
      }
    }
    EXPECT_EQ(checked, 1) << name;
    for (auto& record : records) {
      ASSERT_TRUE((*split)->BackwardWeightStep(std::move(record)).ok()) << name;
    }
    EXPECT_GT(reported, 0) << name;
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i]->main_grad.ToFloats(),
                (*whole)->parameters()[i]->main_grad.ToFloats())
          << name << " " << params[i]->name;
    }
  }
}

TEST(GPTModelTest, RecomputationDoesNotChangeTheResult) {
  const auto variants = Variants();
  auto plain = RunModel(variants[0].second, nullptr, false);
  ASSERT_TRUE(plain.ok());
  for (size_t v = 1; v <= 3; ++v) {
    auto other = RunModel(variants[v].second, nullptr, false);
    ASSERT_TRUE(other.ok());
    EXPECT_EQ(other->loss, plain->loss) << variants[v].first;
    for (size_t i = 0; i < plain->grads.size(); ++i) {
      EXPECT_EQ(other->grads[i], plain->grads[i])
          << variants[v].first << " " << plain->names[i];
    }
  }
}

// A float64 reference of the serial model's loss, written from the math
// (embeddings, pre-LayerNorm blocks with causal attention and a tanh-GELU
// MLP, final LayerNorm, tied output layer, mean cross entropy), reading the
// model's own weights.
class ReferenceGpt {
 public:
  ReferenceGpt(const GPTConfig& c, const ParameterList& params) : c_(c) {
    for (const auto& p : params) w_[p->name] = p->value.ToDoubles();
  }
  std::vector<double>& weight(const std::string& name) { return w_.at(name); }

  double Loss(const MicroBatch& batch) const {
    const int64_t b = batch.tokens.size(0), s = batch.tokens.size(1);
    const int64_t h = c_.hidden_size, nh = c_.num_attention_heads;
    const int64_t d = h / nh, ffn = c_.ffn(), v = c_.vocab_size;
    const auto tok = batch.tokens.ToDoubles();
    const auto lab = batch.labels.ToDoubles();
    const auto& wte = w_.at("embedding.word_embeddings.weight");
    const auto& wpe = w_.at("embedding.position_embeddings.weight");
    double loss = 0, count = 0;
    for (int64_t bi = 0; bi < b; ++bi) {
      std::vector<std::vector<double>> x(s, std::vector<double>(h));
      for (int64_t t = 0; t < s; ++t) {
        const int64_t id = static_cast<int64_t>(tok[bi * s + t]);
        for (int64_t j = 0; j < h; ++j)
          x[t][j] = wte[id * h + j] + wpe[t * h + j];
      }
      for (int l = 0; l < c_.num_layers; ++l) {
        const std::string p = "decoder.layers." + std::to_string(l) + ".";
        std::vector<std::vector<double>> ln(s), q(s), k(s), vv(s);
        for (int64_t t = 0; t < s; ++t) {
          ln[t] = Norm(x[t], p + "input_layernorm");
          const auto qkv =
              Linear(ln[t], p + "self_attention.linear_qkv", 3 * h);
          q[t].resize(h), k[t].resize(h), vv[t].resize(h);
          for (int64_t hd = 0; hd < nh; ++hd) {
            for (int64_t e = 0; e < d; ++e) {
              q[t][hd * d + e] = qkv[(hd * 3 + 0) * d + e];
              k[t][hd * d + e] = qkv[(hd * 3 + 1) * d + e];
              vv[t][hd * d + e] = qkv[(hd * 3 + 2) * d + e];
            }
          }
        }
        for (int64_t t = 0; t < s; ++t) {
          std::vector<double> ctx(h, 0.0);
          for (int64_t hd = 0; hd < nh; ++hd) {
            std::vector<double> score(t + 1);
            double mx = -1e300;
            for (int64_t u = 0; u <= t; ++u) {
              double dot = 0;
              for (int64_t e = 0; e < d; ++e)
                dot += q[t][hd * d + e] * k[u][hd * d + e];
              score[u] = dot / std::sqrt(static_cast<double>(d));
              mx = std::max(mx, score[u]);
            }
            double z = 0;
            for (auto& sc : score) z += (sc = std::exp(sc - mx));
            for (int64_t u = 0; u <= t; ++u) {
              for (int64_t e = 0; e < d; ++e)
                ctx[hd * d + e] += score[u] / z * vv[u][hd * d + e];
            }
          }
          const auto attn = Linear(ctx, p + "self_attention.linear_proj", h);
          for (int64_t j = 0; j < h; ++j) x[t][j] += attn[j];
          auto f = Linear(Norm(x[t], p + "pre_mlp_layernorm"),
                          p + "mlp.linear_fc1", ffn);
          for (auto& a : f) {
            a = 0.5 * a *
                (1 +
                 std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
          }
          const auto m = Linear(f, p + "mlp.linear_fc2", h);
          for (int64_t j = 0; j < h; ++j) x[t][j] += m[j];
        }
      }
      for (int64_t t = 0; t < s; ++t) {
        const int64_t y = static_cast<int64_t>(lab[bi * s + t]);
        if (y == -100) continue;
        const auto f = Norm(x[t], "decoder.final_layernorm");
        std::vector<double> logit(v);
        double mx = -1e300;
        for (int64_t r = 0; r < v; ++r) {
          double dot = 0;
          for (int64_t j = 0; j < h; ++j) dot += f[j] * wte[r * h + j];
          mx = std::max(mx, logit[r] = dot);
        }
        double z = 0;
        for (double lg : logit) z += std::exp(lg - mx);
        loss += std::log(z) + mx - logit[y];
        count += 1;
      }
    }
    return loss / count;
  }

 private:
  std::vector<double> Norm(const std::vector<double>& x,
                           const std::string& name) const {
    const auto& g = w_.at(name + ".weight");
    const auto& beta = w_.at(name + ".bias");
    double mean = 0, var = 0;
    for (double a : x) mean += a;
    mean /= x.size();
    for (double a : x) var += (a - mean) * (a - mean);
    const double rstd = 1.0 / std::sqrt(var / x.size() + c_.norm_epsilon);
    std::vector<double> y(x.size());
    for (size_t j = 0; j < x.size(); ++j)
      y[j] = (x[j] - mean) * rstd * g[j] + beta[j];
    return y;
  }
  std::vector<double> Linear(const std::vector<double>& x,
                             const std::string& name, int64_t out) const {
    const auto& w = w_.at(name + ".weight");
    const auto& bias = w_.at(name + ".bias");
    const int64_t in = static_cast<int64_t>(x.size());
    std::vector<double> y(out);
    for (int64_t o = 0; o < out; ++o) {
      double acc = bias[o];
      for (int64_t i = 0; i < in; ++i) acc += w[o * in + i] * x[i];
      y[o] = acc;
    }
    return y;
  }

  GPTConfig c_;
  std::map<std::string, std::vector<double>> w_;
};

// The serial model's loss equals the float64 reference, and its gradients
// equal central finite differences of that reference in float64.
TEST(GPTModelTest, GradientsMatchFloat64FiniteDifferences) {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.vocab_size = 24;
  c.seq_length = 6;
  c.init_method_std = 0.2;
  parallel::LayerContext ctx;
  auto model = *GPTModel::Create(c, ctx);
  // Non-zero biases and norm parameters, so their gradients are exercised.
  std::mt19937 init(9);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (const auto& p : model->parameters()) {
    if (p->name.find("bias") != std::string::npos ||
        p->name.find("layernorm") != std::string::npos) {
      float* w = p->value.data<float>();
      for (int64_t i = 0; i < p->value.numel(); ++i) w[i] += noise(init);
    }
  }
  const MicroBatch batch = FixedBatch(c, 3);
  auto loss = model->ForwardBackward(batch, 1.0f);
  ASSERT_TRUE(loss.ok()) << loss.status();
  ReferenceGpt ref(c, model->parameters());
  const double ref_loss = ref.Loss(batch);
  EXPECT_NEAR(loss->mean(), ref_loss, 1e-5 * ref_loss);
  std::mt19937 rng(5);
  int checked = 0;
  for (const auto& p : model->parameters()) {
    const std::vector<float> grad = p->main_grad.ToFloats();
    float gmax = 0;
    for (float g : grad) gmax = std::max(gmax, std::abs(g));
    std::vector<double>& w = ref.weight(p->name);
    for (int trial = 0; trial < 6; ++trial) {
      const int64_t i = rng() % p->value.numel();
      const double saved = w[i];
      const double h = 1e-6;
      w[i] = saved + h;
      const double up = ref.Loss(batch);
      w[i] = saved - h;
      const double down = ref.Loss(batch);
      w[i] = saved;
      const double fd = (up - down) / (2 * h);
      // fp32 arithmetic in the model against float64 differences.
      EXPECT_NEAR(grad[i], fd, 2e-3 * gmax + 1e-6)
          << p->name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

// The vocabulary padding is not part of the model: the same initial
// weights, loss and gradients (and logits for generation, which never
// include a padded token) whatever the padding, even with garbage in the
// padding rows.
TEST(GPTModelTest, VocabularyPaddingNeverChangesTheModel) {
  for (bool untied : {false, true}) {
    SCOPED_TRACE(untied ? "untied" : "tied");
    GPTConfig c = TinyConfig();
    c.vocab_size = 100;
    c.untie_embeddings_and_output_weights = untied;
    auto ref = RunModel(c, nullptr, false);
    ASSERT_TRUE(ref.ok()) << ref.status();
    parallel::LayerContext ctx;
    ctx.seed = c.seed;
    auto exact = *GPTModel::Create(c, ctx);
    const MicroBatch batch = FixedBatch(c, 21);
    const LossSum ref_loss = *exact->Forward(batch);
    const Tensor ref_logits = *exact->LastTokenLogits(batch.tokens);
    ASSERT_EQ(ref_logits.shape(), (Shape{kBatch, 100}));
    for (int64_t multiple : {8, 64}) {
      SCOPED_TRACE(multiple);
      c.make_vocab_size_divisible_by = multiple;
      auto r = RunModel(c, nullptr, false);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_NEAR(r->loss, ref->loss, 1e-6 * ref->loss);
      ASSERT_EQ(r->grads.size(), ref->grads.size());
      for (size_t i = 0; i < ref->grads.size(); ++i) {
        ASSERT_EQ(r->grads[i].size(), ref->grads[i].size()) << ref->names[i];
        EXPECT_LE(RelativeError(r->grads[i], ref->grads[i]), 1e-6)
            << ref->names[i];
      }
      auto model = *GPTModel::Create(c, ctx);
      for (size_t i = 0; i < model->parameters().size(); ++i) {
        const Parameter& p = *model->parameters()[i];
        const Parameter& q = *exact->parameters()[i];
        std::vector<float> w = p.value.ToFloats();
        ASSERT_GE(w.size(), q.value.numel()) << p.name;
        w.resize(q.value.numel());
        EXPECT_EQ(w, q.value.ToFloats()) << p.name << " starts elsewhere";
        // Garbage in the padding rows: a padded token would take all the
        // probability and win every argmax if it were not masked.
        if (p.unpadded_rows >= 0) {
          auto pad = *p.value.Slice(p.unpadded_rows, p.value.size(0));
          pad.Fill(1e3);
        }
      }
      const LossSum loss = *model->Forward(batch);
      EXPECT_NEAR(loss.sum, ref_loss.sum, 1e-6 * ref_loss.sum);
      const Tensor logits = *model->LastTokenLogits(batch.tokens);
      ASSERT_EQ(logits.shape(), ref_logits.shape());
      const std::vector<float> a = logits.ToFloats(), b = ref_logits.ToFloats();
      for (size_t i = 0; i < b.size(); ++i) {
        EXPECT_NEAR(a[i], b[i], 1e-5 * (1 + std::abs(b[i]))) << i;
      }
    }
  }
}

TEST(GPTModelTest, BadShapesGiveOneClearMessage) {
  GPTConfig c = TinyConfig();
  c.num_attention_heads = 3;
  c.hidden_size = 63;
  EXPECT_NE(c.Validate(2, false).message().find("--num-attention-heads (3)"),
            std::string::npos);
  GPTConfig v = TinyConfig();
  v.vocab_size = 130;  // Padded for TP, not refused.
  EXPECT_TRUE(v.Validate(4, false).ok());
  EXPECT_EQ(v.padded_vocab_size(4), 132);
  v.make_vocab_size_divisible_by = 0;
  EXPECT_NE(
      v.Validate(4, false).message().find("--make-vocab-size-divisible-by (0)"),
      std::string::npos);
  GPTConfig s = TinyConfig();
  s.seq_length = 18;
  EXPECT_NE(s.Validate(4, true).message().find("--sequence-parallel"),
            std::string::npos);
  EXPECT_TRUE(s.Validate(4, false).ok());
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
