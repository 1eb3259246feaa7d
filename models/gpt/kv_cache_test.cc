// Incremental decoding with a KV cache against full recomputation
// (GPTModel::LastTokenLogits over the whole prefix), serially for several
// model variants and dtypes, and under tensor parallelism in real processes.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"

namespace mcc {
namespace gpt {
namespace {

constexpr int64_t kBatch = 2;
constexpr int64_t kPrompt = 5;
constexpr int kSteps = 6;

GPTConfig TinyConfig() {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 128;
  c.seq_length = 16;
  c.seed = 11;
  return c;
}

// SwiGLU only when serial: it has no tensor-parallel form yet.
std::vector<std::pair<std::string, GPTConfig>> Variants(bool serial) {
  std::vector<std::pair<std::string, GPTConfig>> v;
  v.push_back({"learned_layernorm_gelu", TinyConfig()});
  GPTConfig rope = TinyConfig();
  rope.position_embedding = PositionEmbedding::kRope;
  rope.normalization = Normalization::kRMSNorm;
  rope.untie_embeddings_and_output_weights = true;
  rope.add_bias_linear = false;
  v.push_back({"rope_rmsnorm_untied_nobias", rope});
  GPTConfig gqa = rope;
  gqa.num_query_groups = 2;
  v.push_back({"rope_gqa", gqa});
  GPTConfig dropout = TinyConfig();
  dropout.hidden_dropout = 0.2;  // Must not apply while decoding.
  v.push_back({"dropout_config", dropout});
  if (serial) {
    GPTConfig swiglu = rope;
    swiglu.activation = Activation::kSwiGLU;
    v.push_back({"rope_swiglu", swiglu});
  }
  return v;
}

// The largest |a - b| over the largest |b|.
double MaxRelativeError(const std::vector<float>& a,
                        const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return diff / ref;
}

// Per step (prefill, then kSteps decode steps): the cached logits and the
// full-recompute logits, both [b, vocab]. The next tokens are the greedy
// choice of sequence 0 and a fixed pseudo-random one for sequence 1.
struct Trace {
  std::vector<std::vector<float>> cached, full;
};

absl::StatusOr<Trace> RunTrace(const GPTConfig& config, comm::ProcessGroup* tp,
                               DType dtype) {
  parallel::LayerContext ctx;
  ctx.tp_group = tp;
  ctx.seed = config.seed;
  ctx.dtype = dtype;
  MCC_ASSIGN_OR_RETURN(auto model, GPTModel::Create(config, ctx));
  std::mt19937 rng(3);
  std::vector<std::vector<int64_t>> seqs(kBatch);
  for (auto& s : seqs) {
    for (int i = 0; i < kPrompt; ++i) s.push_back(rng() % config.vocab_size);
  }
  auto as_tensor = [&]() {
    std::vector<int64_t> flat;
    for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
    return *Tensor::FromInts(flat,
                             {kBatch, static_cast<int64_t>(seqs[0].size())});
  };
  MCC_ASSIGN_OR_RETURN(KvCache cache,
                       model->NewKvCache(kBatch, kPrompt + kSteps));
  Trace trace;
  MCC_ASSIGN_OR_RETURN(Tensor logits, model->Prefill(as_tensor(), &cache));
  for (int step = 0;; ++step) {
    MCC_ASSIGN_OR_RETURN(Tensor full, model->LastTokenLogits(as_tensor()));
    trace.cached.push_back(logits.ToFloats());
    trace.full.push_back(full.ToFloats());
    if (step == kSteps) break;
    const std::vector<float>& row = trace.cached.back();
    int64_t best = 0;
    for (int64_t v = 1; v < config.vocab_size; ++v) {
      if (row[v] > row[best]) best = v;
    }
    seqs[0].push_back(best);
    seqs[1].push_back(rng() % config.vocab_size);
    MCC_ASSIGN_OR_RETURN(
        Tensor next, Tensor::FromInts({seqs[0].back(), seqs[1].back()}, {2}));
    MCC_ASSIGN_OR_RETURN(logits, model->DecodeStep(next, &cache));
  }
  return trace;
}

void ExpectTraceMatches(const Trace& trace, double tol) {
  ASSERT_EQ(trace.cached.size(), kSteps + 1u);
  for (size_t i = 0; i < trace.cached.size(); ++i) {
    EXPECT_LE(MaxRelativeError(trace.cached[i], trace.full[i]), tol)
        << "step " << i;
  }
}

TEST(KvCacheTest, DecodingEqualsFullRecomputation) {
  for (const auto& [name, config] : Variants(/*serial=*/true)) {
    SCOPED_TRACE(name);
    auto trace = RunTrace(config, nullptr, DType::kFloat32);
    ASSERT_TRUE(trace.ok()) << trace.status();
    ExpectTraceMatches(*trace, 1e-5);
  }
}

TEST(KvCacheTest, Bf16DecodingTracksFullRecomputation) {
  // bf16 activations round differently for a single row than for the whole
  // prefix (GEMM blocking), so the bound is bf16's, not fp32's.
  auto trace = RunTrace(TinyConfig(), nullptr, DType::kBFloat16);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ExpectTraceMatches(*trace, 2e-2);
}

TEST(KvCacheTest, ErrorsNameTheProblem) {
  parallel::LayerContext ctx;
  auto model = GPTModel::Create(TinyConfig(), ctx);
  ASSERT_TRUE(model.ok());
  auto too_long = (*model)->NewKvCache(1, 17);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("position table"),
            std::string::npos);
  auto cache = (*model)->NewKvCache(1, 4);
  ASSERT_TRUE(cache.ok());
  auto overflow =
      (*model)->Prefill(*Tensor::FromInts({1, 2, 3, 4, 5}, {1, 5}), &*cache);
  ASSERT_FALSE(overflow.ok());
  EXPECT_NE(overflow.status().message().find("capacity 4"), std::string::npos)
      << overflow.status();
  auto bad_token =
      (*model)->Prefill(*Tensor::FromInts({1, 200}, {1, 2}), &*cache);
  ASSERT_FALSE(bad_token.ok());
  EXPECT_NE(bad_token.status().message().find("200"), std::string::npos);
}

std::string TracePath(const std::string& variant) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/kv_cache_tp2_", variant, ".txt");
}

MCC_WORKER(kv_cache_tp) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    std::fprintf(stderr, "init: %s\n", world.status().ToString().c_str());
    return 3;
  }
  for (const auto& [name, config] : Variants(/*serial=*/false)) {
    auto trace = RunTrace(config, world->group.get(), DType::kFloat32);
    if (!trace.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(),
                   trace.status().ToString().c_str());
      return 4;
    }
    if (world->group->rank() != 0) continue;
    FILE* f = std::fopen(TracePath(name).c_str(), "w");
    for (const auto& step : trace->cached) {
      for (float v : step) std::fprintf(f, "%.9g ", v);
      std::fprintf(f, "\n");
    }
    std::fclose(f);
  }
  return 0;
}

TEST(KvCacheTest, TensorParallelDecodingEqualsSerialFullRecomputation) {
  auto results =
      comm::testing::RunWorkers(2, "kv_cache_tp", absl::Seconds(120));
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  for (const auto& [name, config] : Variants(/*serial=*/false)) {
    SCOPED_TRACE(name);
    auto serial = RunTrace(config, nullptr, DType::kFloat32);
    ASSERT_TRUE(serial.ok()) << serial.status();
    FILE* f = std::fopen(TracePath(name).c_str(), "r");
    ASSERT_NE(f, nullptr);
    for (size_t step = 0; step < serial->full.size(); ++step) {
      std::vector<float> row(serial->full[step].size());
      for (float& v : row) ASSERT_EQ(std::fscanf(f, "%f", &v), 1);
      EXPECT_LE(MaxRelativeError(row, serial->full[step]), 1e-5)
          << "step " << step;
    }
    std::fclose(f);
  }
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
