// The engine against the training model's forward pass (greedy argmax over
// the whole prefix), and against itself: batching, chunking, a full KV pool
// and full recompute (eval --no-kv-cache) never change a request's tokens
// or log-probabilities (bit for bit), serially and under tensor
// parallelism in real processes.
#include "inference/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "data/tokenizer.h"
#include "gtest/gtest.h"
#include "inference/inference_weights.h"
#include "inference/model_runner.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/int8_quantization.h"

namespace mcc {
namespace inference {
namespace {

gpt::GPTConfig TinyConfig() {
  gpt::GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 264;  // The byte tokenizer's 257 and padding ids.
  c.seq_length = 48;
  c.seed = 11;
  return c;
}

// moe: also mixtures of experts (serial only; int8 does not cover experts).
std::vector<std::pair<std::string, gpt::GPTConfig>> Variants(bool serial,
                                                             bool moe = false) {
  std::vector<std::pair<std::string, gpt::GPTConfig>> v;
  v.push_back({"learned_layernorm_gelu", TinyConfig()});
  gpt::GPTConfig rope = TinyConfig();
  rope.position_embedding = gpt::PositionEmbedding::kRope;
  rope.normalization = gpt::Normalization::kRMSNorm;
  rope.untie_embeddings_and_output_weights = true;
  rope.add_bias_linear = false;
  v.push_back({"rope_rmsnorm_untied_nobias", rope});
  gpt::GPTConfig gqa = rope;
  gqa.num_query_groups = 2;
  v.push_back({"rope_gqa", gqa});
  // Qwen's attention (QKV bias, QK-norm) with Llama 3's scaled rotary
  // frequencies (an original context of 4 positions scales most of them).
  gpt::GPTConfig qwen = gqa;
  qwen.add_qkv_bias = true;
  qwen.qk_layernorm = true;
  qwen.rope_scaling.enabled = true;
  qwen.rope_scaling.original_max_position_embeddings = 4;
  v.push_back({"qwen_qk_norm_qkv_bias_rope_scaling", qwen});
  // Mistral: a sliding window of 5 keys, shorter than prompt plus output.
  gpt::GPTConfig mistral = gqa;
  mistral.activation = gpt::Activation::kSwiGLU;
  mistral.window_left = 4;
  v.push_back({"mistral_sliding_window", mistral});
  if (serial) {
    gpt::GPTConfig swiglu = rope;
    swiglu.activation = gpt::Activation::kSwiGLU;
    v.push_back({"rope_swiglu", swiglu});
  }
  if (serial && moe) {
    const gpt::GPTConfig swiglu = v.back().second;
    // Mixtures of experts (no tensor parallelism): a Mixtral-like layer
    // after a dense one, and sigmoid routing with a shared expert and an
    // expert bias on both layers.
    gpt::GPTConfig top2 = swiglu;
    top2.num_experts = 4;
    top2.moe_router_topk = 2;
    top2.moe_ffn_hidden_size = 48;
    top2.moe_layer_freq = "[0,1]";
    v.push_back({"moe_top2", top2});
    gpt::GPTConfig shared = top2;
    shared.moe_layer_freq = "1";
    shared.moe_router_score_function = ops::MoeScoreFunction::kSigmoid;
    shared.moe_shared_expert_intermediate_size = 32;
    shared.moe_router_enable_expert_bias = true;
    v.push_back({"moe_sigmoid_shared_bias", shared});
  }
  return v;
}

// A model, its engine-side copy and an engine over it.
struct Setup {
  std::unique_ptr<gpt::GPTModel> model;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<LocalStepExecutor> executor;
  std::unique_ptr<Engine> engine;
};

absl::StatusOr<std::unique_ptr<Setup>> MakeSetup(const gpt::GPTConfig& config,
                                                 comm::ProcessGroup* tp,
                                                 SchedulerOptions scheduler,
                                                 int64_t blocks = 64,
                                                 int64_t block_size = 4,
                                                 bool int8 = false) {
  auto setup = std::make_unique<Setup>();
  parallel::LayerContext ctx;
  ctx.tp_group = tp;
  ctx.seed = config.seed;
  MCC_ASSIGN_OR_RETURN(setup->model, gpt::GPTModel::Create(config, ctx));
  if (int8) {
    MCC_RETURN_IF_ERROR(gpt::QuantizeLinearWeightsInt8(setup->model.get()));
  }
  MCC_ASSIGN_OR_RETURN(InferenceWeights weights,
                       LoadInferenceWeights(*setup->model));
  const KvCacheShape shape = CacheShapeFor(weights, block_size);
  setup->runner = std::make_unique<ModelRunner>(
      std::move(weights), tp, PagedKvCache::WithBlocks(shape, blocks));
  setup->executor = std::make_unique<LocalStepExecutor>(setup->runner.get());
  EngineOptions options;
  options.scheduler = scheduler;
  options.scheduler.window_left = config.window_left;
  options.max_positions = config.max_positions();
  options.model_vocab = config.vocab_size;
  setup->engine = std::make_unique<Engine>(options, setup->executor.get(),
                                           &setup->runner->cache(),
                                           data::MakeByteTokenizer());
  return setup;
}

// Submits every request, steps until all finished; the last events.
absl::StatusOr<std::vector<GenerationEvent>> RunAll(
    Engine* engine, const std::vector<GenerationRequest>& requests,
    int64_t* max_waiting = nullptr) {
  std::vector<GenerationEvent> results(requests.size());
  int done = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    MCC_RETURN_IF_ERROR(
        engine
            ->Submit(requests[i],
                     [&results, &done, i](const GenerationEvent& e) {
                       if (e.finished) {
                         results[i] = e;
                         ++done;
                       }
                     })
            .status());
  }
  for (int steps = 0; done < static_cast<int>(requests.size()); ++steps) {
    MCC_ASSIGN_OR_RETURN(bool worked, engine->Step());
    if (max_waiting != nullptr) {
      *max_waiting = std::max(*max_waiting, engine->metrics().waiting());
    }
    if (!worked || steps > 10000) {
      return absl::InternalError("the engine stopped with requests left");
    }
  }
  return results;
}

std::vector<GenerationRequest> MixedRequests(int n, int64_t vocab) {
  std::mt19937 rng(5);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    const int len = 1 + rng() % 20;
    for (int j = 0; j < len; ++j) r.prompt.push_back(rng() % vocab);
    r.max_new_tokens = 1 + rng() % 12;
    r.stop_at_eod = i % 2 == 0;
    switch (i % 4) {
      case 0:
        r.sampling.temperature = 0;
        break;
      case 1:
        r.sampling.temperature = 0.8;
        r.sampling.top_k = 20;
        break;
      case 2:
        r.sampling.temperature = 1.3;
        r.sampling.top_p = 0.9;
        break;
      default:
        r.sampling.temperature = 1.0;
        break;
    }
    r.sampling.seed = 100 + i;
    r.prompt_logprobs = i % 3 == 0;
    requests.push_back(r);
  }
  return requests;
}

// Batched results must equal the requests run alone, bit for bit.
void ExpectSame(const std::vector<GenerationEvent>& a,
                const std::vector<GenerationEvent>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].logprobs, b[i].logprobs);
    EXPECT_EQ(a[i].prompt_logprobs, b[i].prompt_logprobs);
    EXPECT_EQ(a[i].text, b[i].text);
    EXPECT_EQ(a[i].finish_reason, b[i].finish_reason);
  }
}

absl::StatusOr<std::vector<GenerationEvent>> Alone(
    const gpt::GPTConfig& config, const std::vector<GenerationRequest>& rs,
    bool int8 = false) {
  std::vector<GenerationEvent> out;
  for (const GenerationRequest& r : rs) {
    SchedulerOptions one;
    one.max_batch_size = 1;
    one.prefill_chunk_size = 64;
    MCC_ASSIGN_OR_RETURN(auto setup,
                         MakeSetup(config, nullptr, one, 64, 4, int8));
    MCC_ASSIGN_OR_RETURN(auto result, RunAll(setup->engine.get(), {r}));
    out.push_back(result[0]);
  }
  return out;
}

// The plainest greedy generation: the training model's forward pass over
// the whole prefix (GPTModel::LastTokenLogits) for every token, argmax over
// the tokenizer's 257 ids. Returns each step's logits.
absl::StatusOr<std::vector<std::vector<float>>> ReferenceGreedy(
    gpt::GPTModel* model, std::vector<int64_t> tokens, int steps,
    std::vector<int64_t>* generated) {
  std::vector<std::vector<float>> all;
  for (int i = 0; i < steps; ++i) {
    MCC_ASSIGN_OR_RETURN(
        Tensor logits, model->LastTokenLogits(*Tensor::FromInts(
                           tokens, {1, static_cast<int64_t>(tokens.size())})));
    all.push_back(logits.ToFloats());
    const std::vector<float>& row = all.back();
    const int64_t next =
        std::max_element(row.begin(), row.begin() + 257) - row.begin();
    generated->push_back(next);
    tokens.push_back(next);
  }
  return all;
}

// The engine's greedy tokens for a chunked prompt equal the forward-pass
// argmax of the training model (the model int8 too when asked),
// log-probabilities within 1e-4: both fp32 throughout, summed in other
// orders. With `recompute_prefix` the engine recomputes the whole prefix
// every step (eval --no-kv-cache). Returns the engine's result.
GenerationEvent ExpectGreedyMatchesTheForwardPass(
    const gpt::GPTConfig& config, bool int8, std::unique_ptr<Setup>* kept,
    bool recompute_prefix = false) {
  SchedulerOptions chunked;
  chunked.prefill_chunk_size = 3;  // The prompt runs in chunks.
  chunked.recompute_prefix = recompute_prefix;
  auto setup = MakeSetup(config, nullptr, chunked, 64, 4, int8);
  EXPECT_TRUE(setup.ok()) << setup.status();
  if (!setup.ok()) return {};
  GenerationRequest r;
  r.prompt = {72, 101, 108, 108, 111, 44, 32};
  r.max_new_tokens = 10;
  r.sampling.temperature = 0;
  r.stop_at_eod = false;
  auto got = RunAll((*setup)->engine.get(), {r});
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok()) return {};
  std::vector<int64_t> want;
  auto logits = ReferenceGreedy((*setup)->model.get(), r.prompt, 10, &want);
  EXPECT_TRUE(logits.ok()) << logits.status();
  if (!logits.ok()) return {};
  EXPECT_EQ((*got)[0].tokens, want);
  EXPECT_EQ((*got)[0].logprobs.size(), want.size());
  for (size_t i = 0; i < want.size() && i < (*got)[0].logprobs.size(); ++i) {
    EXPECT_NEAR((*got)[0].logprobs[i],
                TokenLogProb((*logits)[i].data(), 257, want[i]), 1e-4);
  }
  if (kept != nullptr) *kept = std::move(*setup);
  return (*got)[0];
}

TEST(EngineTest, GreedyMatchesTheForwardPass) {
  for (const auto& [name, config] : Variants(/*serial=*/true, /*moe=*/true)) {
    SCOPED_TRACE(name);
    ExpectGreedyMatchesTheForwardPass(config, /*int8=*/false, nullptr);
  }
}

// Full recompute (eval --no-kv-cache) is a mode of the engine: the same
// reference holds, and it gives the cached mode's results bit for bit
// (every row is computed alone, wherever its keys and values came from),
// for every variant and for mixed batched requests with prompt
// log-probabilities and sampling.
TEST(EngineTest, FullRecomputeMatchesTheForwardPassAndTheCache) {
  for (const auto& [name, config] : Variants(/*serial=*/true, /*moe=*/true)) {
    SCOPED_TRACE(name);
    const GenerationEvent recomputed = ExpectGreedyMatchesTheForwardPass(
        config, /*int8=*/false, nullptr, /*recompute_prefix=*/true);
    const GenerationEvent cached =
        ExpectGreedyMatchesTheForwardPass(config, /*int8=*/false, nullptr);
    ExpectSame({recomputed}, {cached});
    const auto requests = MixedRequests(8, 257);
    auto alone = Alone(config, requests);
    ASSERT_TRUE(alone.ok()) << alone.status();
    SchedulerOptions batched;
    batched.max_batch_size = 5;
    batched.prefill_chunk_size = 4;
    batched.max_tokens_per_step = 9;
    batched.recompute_prefix = true;
    auto setup = MakeSetup(config, nullptr, batched);
    ASSERT_TRUE(setup.ok()) << setup.status();
    auto together = RunAll((*setup)->engine.get(), requests);
    ASSERT_TRUE(together.ok()) << together.status();
    ExpectSame(*together, *alone);
  }
}

// Each decoding step of the full-recompute mode runs every position again:
// the step's rows grow with the prefix (the cached mode runs one).
TEST(EngineTest, FullRecomputeRunsTheWholePrefixEveryStep) {
  const gpt::GPTConfig config = TinyConfig();
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "cached");
    SchedulerOptions options;
    options.prefill_chunk_size = 64;
    options.recompute_prefix = recompute;
    auto setup = MakeSetup(config, nullptr, options);
    ASSERT_TRUE(setup.ok()) << setup.status();
    Scheduler scheduler(options, &(*setup)->runner->cache());
    GenerationRequest r;
    r.prompt = {1, 2, 3};
    r.max_new_tokens = 4;
    r.prompt_logprobs = true;
    auto s = std::make_unique<Sequence>(1, r, [](const GenerationEvent&) {});
    Sequence* seq = s.get();
    scheduler.Add(std::move(s));
    StepPlan prefill = scheduler.Plan();
    ASSERT_EQ(prefill.rows.rows(), 3);
    EXPECT_EQ(prefill.rows.logit_rows, (std::vector<int32_t>{0, 1, 2}));
    seq->computed = 3;
    seq->tokens.push_back(9);
    for (int64_t length = 4; length <= 6; ++length) {
      StepPlan step = scheduler.Plan();
      ASSERT_EQ(step.slices.size(), 1u);
      const int64_t rows = recompute ? length : 1;
      ASSERT_EQ(step.rows.rows(), rows);
      EXPECT_EQ(step.rows.positions.front(), length - rows);
      EXPECT_EQ(step.rows.positions.back(), length - 1);
      // Only the newest row's logits: no prompt log-probability again.
      EXPECT_EQ(step.rows.logit_rows,
                (std::vector<int32_t>{static_cast<int32_t>(rows - 1)}));
      seq->computed = length;
      seq->tokens.push_back(9);
    }
  }
}

// Weight-only int8 (eval/serve --quantize int8): the engine computes with the
// int8 weights and scales that the model's own int8 layers use, so its
// greedy tokens follow the int8 model's forward pass (both sum fp32
// products of the same widened weights, in other orders), not the dense
// model's, and batching still changes nothing.
TEST(EngineTest, Int8GreedyMatchesTheInt8ModelsForwardPass) {
  for (const auto& [name, config] : Variants(/*serial=*/true)) {
    SCOPED_TRACE(name);
    std::unique_ptr<mcc::inference::Setup> setup;
    const GenerationEvent int8 =
        ExpectGreedyMatchesTheForwardPass(config, /*int8=*/true, &setup);
    ASSERT_NE(setup, nullptr);
    const LayerWeights& first = setup->runner->weights().layers[0];
    for (const LinearWeights* lin :
         {&first.qkv, &first.proj, &first.fc1, &first.fc2}) {
      // The runner holds the values packed (RowGemmWeights), these freed.
      EXPECT_TRUE(lin->weight.empty());
      EXPECT_TRUE(lin->q.empty());
      EXPECT_EQ(static_cast<int64_t>(lin->scales.size()), lin->out);
    }
    // The same request on the dense model, through the same engine code:
    // were the int8 weights ignored, every log-probability would be equal;
    // int8's rounding (up to half a step of 1/127 of each row's largest
    // weight) moves them by more than the 1e-4 that summation order may.
    std::unique_ptr<mcc::inference::Setup> dense_setup;
    const GenerationEvent dense =
        ExpectGreedyMatchesTheForwardPass(config, /*int8=*/false, &dense_setup);
    ASSERT_NE(dense_setup, nullptr);
    // Packed int8 values take a quarter of fp32's bytes (plus fp32 scales).
    EXPECT_LT(setup->runner->linear_weight_bytes() * 3,
              dense_setup->runner->linear_weight_bytes());
    double max_diff = 0;
    for (size_t i = 0; i < int8.logprobs.size() && i < dense.logprobs.size();
         ++i) {
      max_diff = std::max<double>(
          max_diff, std::abs(int8.logprobs[i] - dense.logprobs[i]));
    }
    EXPECT_GT(max_diff, 1e-4) << "the engine ignored the int8 weights";
  }
}

TEST(EngineTest, Int8BatchingNeverChangesResults) {
  const gpt::GPTConfig config = Variants(/*serial=*/true).back().second;
  const auto requests = MixedRequests(8, 257);
  auto alone = Alone(config, requests, /*int8=*/true);
  ASSERT_TRUE(alone.ok()) << alone.status();
  SchedulerOptions batched;
  batched.max_batch_size = 5;
  batched.prefill_chunk_size = 4;
  batched.max_tokens_per_step = 9;
  auto setup = MakeSetup(config, nullptr, batched, 64, 4, /*int8=*/true);
  ASSERT_TRUE(setup.ok()) << setup.status();
  auto together = RunAll((*setup)->engine.get(), requests);
  ASSERT_TRUE(together.ok()) << together.status();
  ExpectSame(*together, *alone);
}

TEST(EngineTest, PromptLogprobsMatchTheFullForward) {
  const gpt::GPTConfig config = TinyConfig();
  auto setup = MakeSetup(config, nullptr, {});
  ASSERT_TRUE(setup.ok()) << setup.status();
  GenerationRequest r;
  r.prompt = {3, 250, 17, 99, 42, 8};
  r.max_new_tokens = 0;
  r.prompt_logprobs = true;
  auto got = RunAll((*setup)->engine.get(), {r});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)[0].tokens.empty());
  EXPECT_EQ((*got)[0].finish_reason, FinishReason::kLength);
  ASSERT_EQ((*got)[0].prompt_logprobs.size(), r.prompt.size() - 1);
  for (size_t i = 1; i < r.prompt.size(); ++i) {
    std::vector<int64_t> prefix(r.prompt.begin(), r.prompt.begin() + i);
    auto logits = (*setup)->model->LastTokenLogits(
        *Tensor::FromInts(prefix, {1, static_cast<int64_t>(prefix.size())}));
    ASSERT_TRUE(logits.ok());
    EXPECT_NEAR((*got)[0].prompt_logprobs[i - 1],
                TokenLogProb(logits->ToFloats().data(), 257, r.prompt[i]),
                1e-4);
  }
}

TEST(EngineTest, BatchingAndChunkingNeverChangeResults) {
  for (const auto& [name, config] : Variants(/*serial=*/true, /*moe=*/true)) {
    SCOPED_TRACE(name);
    const auto requests = MixedRequests(12, 257);
    auto alone = Alone(config, requests);
    ASSERT_TRUE(alone.ok()) << alone.status();
    for (bool static_batching : {false, true}) {
      SchedulerOptions batched;
      batched.max_batch_size = 5;
      batched.prefill_chunk_size = 4;
      batched.max_tokens_per_step = 9;
      batched.static_batching = static_batching;
      auto setup = MakeSetup(config, nullptr, batched);
      ASSERT_TRUE(setup.ok()) << setup.status();
      auto together = RunAll((*setup)->engine.get(), requests);
      ASSERT_TRUE(together.ok()) << together.status();
      ExpectSame(*together, *alone);
    }
  }
}

// A sliding window gives back the blocks behind it while the sequence
// decodes (blocks of 4 tokens, a window of 5 keys).
TEST(EngineTest, SlidingWindowFreesBlocksBehindIt) {
  const gpt::GPTConfig config = Variants(/*serial=*/true)[4].second;
  ASSERT_EQ(config.window_left, 4);
  auto setup = MakeSetup(config, nullptr, SchedulerOptions(), 16, 4);
  ASSERT_TRUE(setup.ok()) << setup.status();
  GenerationRequest r;
  r.prompt = {72, 101, 108, 108, 111, 44, 32};
  r.max_new_tokens = 30;  // 37 positions: 10 blocks at admission.
  r.sampling.temperature = 0;
  r.stop_at_eod = false;
  bool finished = false;
  ASSERT_TRUE((*setup)
                  ->engine
                  ->Submit(r,
                           [&](const GenerationEvent& e) {
                             finished = finished || e.finished;
                           })
                  .ok());
  const PagedKvCache& cache = (*setup)->runner->cache();
  int64_t least_free = cache.num_blocks(), most_free_running = 0;
  for (int steps = 0; !finished && steps < 100; ++steps) {
    ASSERT_TRUE((*setup)->engine->Step().ok());
    least_free = std::min(least_free, cache.free_blocks());
    if (!finished) {
      most_free_running = std::max(most_free_running, cache.free_blocks());
    }
  }
  ASSERT_TRUE(finished);
  EXPECT_EQ(least_free, 16 - 10);
  // Near the end only the window's two or three blocks and those still
  // ahead are held.
  EXPECT_GE(most_free_running, 16 - 3);
  EXPECT_EQ(cache.free_blocks(), 16);
}

TEST(EngineTest, RequestsWaitWhenThePoolIsFull) {
  const gpt::GPTConfig config = TinyConfig();
  const auto requests = MixedRequests(8, 257);
  auto alone = Alone(config, requests);
  ASSERT_TRUE(alone.ok()) << alone.status();
  SchedulerOptions wide;
  wide.max_batch_size = 8;
  // 9 blocks of 4 positions: two or three requests at a time.
  auto setup = MakeSetup(config, nullptr, wide, /*blocks=*/9);
  ASSERT_TRUE(setup.ok()) << setup.status();
  int64_t max_waiting = 0;
  auto together = RunAll((*setup)->engine.get(), requests, &max_waiting);
  ASSERT_TRUE(together.ok()) << together.status();
  EXPECT_GE(max_waiting, 4);
  ExpectSame(*together, *alone);
  EXPECT_EQ((*setup)->runner->cache().free_blocks(), 9);
}

TEST(EngineTest, StopStringCutsTheText) {
  const gpt::GPTConfig config = TinyConfig();
  auto setup = MakeSetup(config, nullptr, {});
  ASSERT_TRUE(setup.ok());
  GenerationRequest r;
  r.prompt = {72, 105};
  r.max_new_tokens = 12;
  r.sampling.temperature = 0;
  r.stop_at_eod = false;
  auto first = RunAll((*setup)->engine.get(), {r});
  ASSERT_TRUE(first.ok());
  const std::string text = (*first)[0].text;
  ASSERT_GE(text.size(), 6u);
  r.stop = {text.substr(3, 2)};
  std::string streamed;
  std::vector<GenerationEvent> last(1);
  bool done = false;
  ASSERT_TRUE((*setup)
                  ->engine
                  ->Submit(r,
                           [&](const GenerationEvent& e) {
                             streamed += e.text_delta;
                             if (e.finished) {
                               last[0] = e;
                               done = true;
                             }
                           })
                  .ok());
  while (!done) ASSERT_TRUE((*setup)->engine->Step().ok());
  EXPECT_EQ(last[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(last[0].text, text.substr(0, text.find(r.stop[0])));
  EXPECT_EQ(streamed, last[0].text);
}

// eval's path: one request stepped to its end without a Run thread.
TEST(EngineTest, GenerateOneReturnsTheLastEventOrTheRefusal) {
  const gpt::GPTConfig config = TinyConfig();
  const auto requests = MixedRequests(3, 257);
  auto alone = Alone(config, requests);
  ASSERT_TRUE(alone.ok()) << alone.status();
  SchedulerOptions one;
  one.max_batch_size = 1;
  auto setup = MakeSetup(config, nullptr, one);
  ASSERT_TRUE(setup.ok()) << setup.status();
  std::vector<GenerationEvent> got;
  for (const GenerationRequest& r : requests) {
    absl::Time first_step = absl::InfinitePast();
    auto event = GenerateOne((*setup)->engine.get(), r, &first_step);
    ASSERT_TRUE(event.ok()) << event.status();
    EXPECT_TRUE(event->finished);
    EXPECT_NE(first_step, absl::InfinitePast());
    got.push_back(*event);
  }
  ExpectSame(got, *alone);
  GenerationRequest bad = requests[0];
  bad.prompt.clear();
  auto refused = GenerateOne((*setup)->engine.get(), bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no tokens"), std::string::npos)
      << refused.status();
}

TEST(EngineTest, CancelFreesTheBlocks) {
  auto setup = MakeSetup(TinyConfig(), nullptr, {}, /*blocks=*/16);
  ASSERT_TRUE(setup.ok());
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 20;
  FinishReason reason = FinishReason::kNone;
  int tokens = 0;
  auto id = (*setup)->engine->Submit(r, [&](const GenerationEvent& e) {
    if (e.has_token) ++tokens;
    if (e.finished) reason = e.finish_reason;
  });
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*setup)->engine->Step().ok());
  ASSERT_TRUE((*setup)->engine->Step().ok());
  EXPECT_LT((*setup)->runner->cache().free_blocks(), 16);
  (*setup)->engine->Cancel(*id);
  ASSERT_TRUE((*setup)->engine->Step().ok());
  EXPECT_EQ(reason, FinishReason::kCancelled);
  EXPECT_EQ(tokens, 2);
  EXPECT_EQ((*setup)->runner->cache().free_blocks(), 16);
}

TEST(EngineTest, BadRequestsAreRefusedWithAReason) {
  auto setup = MakeSetup(TinyConfig(), nullptr, {}, /*blocks=*/4);
  ASSERT_TRUE(setup.ok());
  Engine& engine = *(*setup)->engine;
  auto refused = [&](GenerationRequest r, const std::string& words) {
    auto id = engine.Submit(r, [](const GenerationEvent&) {});
    ASSERT_FALSE(id.ok());
    EXPECT_NE(id.status().message().find(words), std::string::npos)
        << id.status();
  };
  GenerationRequest ok;
  ok.prompt = {1, 2};
  ok.max_new_tokens = 2;
  GenerationRequest r = ok;
  r.prompt.clear();
  refused(r, "no tokens");
  r = ok;
  r.prompt = {1, 264};
  refused(r, "outside the vocabulary");
  r = ok;
  r.max_new_tokens = 47;
  refused(r, "context of 48");
  r = ok;
  r.max_new_tokens = 20;  // 22 positions: 6 blocks of 4, the pool has 4.
  refused(r, "pool holds only 4");
  r = ok;
  r.sampling.temperature = -1;
  refused(r, "temperature");
  r = ok;
  r.sampling.top_p = 1.5;
  refused(r, "top_p");
}

// A client's max_tokens of INT64_MAX once wrapped prompt + max_new_tokens
// negative: the request passed, got no blocks, and the model runner refused
// the step, which stopped the engine (and serve).
TEST(EngineTest, MaxNewTokensNearInt64MaxIsRefusedNotOverflowed) {
  auto setup = MakeSetup(TinyConfig(), nullptr, {}, /*blocks=*/4);
  ASSERT_TRUE(setup.ok());
  Engine& engine = *(*setup)->engine;
  for (int64_t max_new : {std::numeric_limits<int64_t>::max(),
                          std::numeric_limits<int64_t>::max() - 1,
                          std::numeric_limits<int64_t>::max() - 2}) {
    GenerationRequest r;
    r.prompt = {1, 2, 3};
    r.max_new_tokens = max_new;
    auto id = engine.Submit(r, [](const GenerationEvent&) {});
    ASSERT_FALSE(id.ok()) << max_new;
    EXPECT_TRUE(absl::IsInvalidArgument(id.status())) << id.status();
    EXPECT_NE(id.status().message().find("context of 48"), std::string::npos)
        << id.status();
  }
  EXPECT_EQ(engine.unfinished(), 0);
  auto worked = engine.Step();
  ASSERT_TRUE(worked.ok()) << worked.status();
  EXPECT_FALSE(*worked);
}

TEST(EngineTest, PromptTokenLimitRefuses) {
  SchedulerOptions scheduler;
  auto setup = MakeSetup(TinyConfig(), nullptr, scheduler);
  ASSERT_TRUE(setup.ok());
  EngineOptions options = (*setup)->engine->options();
  options.max_prompt_tokens = 4;
  Engine engine(options, (*setup)->executor.get(), &(*setup)->runner->cache(),
                nullptr);
  GenerationRequest r;
  r.prompt = {1, 2, 3, 4, 5};
  r.max_new_tokens = 1;
  auto id = engine.Submit(r, [](const GenerationEvent&) {});
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("--max-prompt-tokens"),
            std::string::npos)
      << id.status();
  r.prompt.pop_back();
  EXPECT_TRUE(engine.Submit(r, [](const GenerationEvent&) {}).ok());
}

TEST(EngineTest, QueueLimitRefusesWithResourceExhausted) {
  SchedulerOptions scheduler;
  scheduler.max_batch_size = 1;
  auto setup = MakeSetup(TinyConfig(), nullptr, scheduler, /*blocks=*/64);
  ASSERT_TRUE(setup.ok());
  EngineOptions options = (*setup)->engine->options();
  options.max_queued_requests = 2;
  Engine engine(options, (*setup)->executor.get(), &(*setup)->runner->cache(),
                nullptr);
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 2;
  int finished = 0;
  auto count = [&](const GenerationEvent& e) { finished += e.finished; };
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine.Submit(r, count).ok()) << i;
  auto refused = engine.Submit(r, count);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  while (finished < 3) ASSERT_TRUE(engine.Step().ok());
  EXPECT_EQ(engine.unfinished(), 0);
  EXPECT_TRUE(engine.Submit(r, count).ok());  // Room again.
}

TEST(EngineTest, DeadlineEndsRunningAndWaitingRequestsAndFreesBlocks) {
  SchedulerOptions scheduler;
  scheduler.max_batch_size = 1;
  auto setup = MakeSetup(TinyConfig(), nullptr, scheduler, /*blocks=*/16);
  ASSERT_TRUE(setup.ok());
  Engine& engine = *(*setup)->engine;
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 30;
  r.stop_at_eod = false;
  std::vector<FinishReason> reasons(2, FinishReason::kNone);
  for (int i = 0; i < 2; ++i) {
    r.deadline = absl::Now() + absl::Milliseconds(150);
    ASSERT_TRUE(engine
                    .Submit(r,
                            [&reasons, i](const GenerationEvent& e) {
                              if (e.finished) reasons[i] = e.finish_reason;
                            })
                    .ok());
  }
  ASSERT_TRUE(engine.Step().ok());
  EXPECT_LT((*setup)->runner->cache().free_blocks(), 16);
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(engine.Step().ok());
  EXPECT_EQ(reasons[0], FinishReason::kTimeout);  // Was running.
  EXPECT_EQ(reasons[1], FinishReason::kTimeout);  // Was waiting.
  EXPECT_EQ((*setup)->runner->cache().free_blocks(), 16);
  EXPECT_EQ(engine.unfinished(), 0);
  EXPECT_STREQ(FinishReasonName(FinishReason::kTimeout), "timeout");
}

TEST(EngineTest, RunServesThenRefusesOnceStopped) {
  auto setup = MakeSetup(TinyConfig(), nullptr, {});
  ASSERT_TRUE(setup.ok());
  Engine& engine = *(*setup)->engine;
  absl::Status status;
  std::thread runner([&] { status = engine.Run(); });
  GenerationRequest r;
  r.prompt = {5, 6, 7};
  r.max_new_tokens = 4;
  r.stop_at_eod = false;
  absl::Mutex mu;
  bool done = false;
  std::vector<int64_t> tokens;
  ASSERT_TRUE(engine
                  .Submit(r,
                          [&](const GenerationEvent& e) {
                            absl::MutexLock lock(&mu);
                            if (e.finished) {
                              tokens = e.tokens;
                              done = true;
                            }
                          })
                  .ok());
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
  }
  EXPECT_EQ(tokens.size(), 4u);
  engine.Stop();
  runner.join();
  EXPECT_TRUE(status.ok()) << status;
  auto late = engine.Submit(r, [](const GenerationEvent&) {});
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(absl::IsUnavailable(late.status())) << late.status();
}

// The tensor-parallel cases: every variant, and one with int8 weights
// (quantised collectively, so each rank holds its part of the serial int8
// weights).
struct TpCase {
  std::string name;
  gpt::GPTConfig config;
  bool int8;
};
std::vector<TpCase> TpCases() {
  std::vector<TpCase> cases;
  for (const auto& [name, config] : Variants(/*serial=*/false)) {
    cases.push_back({name, config, false});
  }
  cases.push_back({"rope_gqa_int8", cases.back().config, true});
  return cases;
}

std::string ResultPath(const std::string& variant) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/engine_tp2_", variant, ".txt");
}

MCC_WORKER(engine_tp) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    std::fprintf(stderr, "init: %s\n", world.status().ToString().c_str());
    return 3;
  }
  for (const auto& [name, config, int8] : TpCases()) {
    SchedulerOptions batched;
    batched.max_batch_size = 4;
    batched.prefill_chunk_size = 5;
    auto setup = MakeSetup(config, world->group.get(), batched, 64, 4, int8);
    if (!setup.ok()) return 4;
    auto results = RunAll((*setup)->engine.get(), MixedRequests(6, 257));
    if (!results.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(),
                   results.status().ToString().c_str());
      return 5;
    }
    if (world->group->rank() != 0) continue;
    FILE* f = std::fopen(ResultPath(name).c_str(), "w");
    for (const GenerationEvent& e : *results) {
      std::fprintf(f, "%zu", e.tokens.size());
      for (size_t i = 0; i < e.tokens.size(); ++i) {
        std::fprintf(f, " %lld %.17g", static_cast<long long>(e.tokens[i]),
                     e.logprobs[i]);
      }
      std::fprintf(f, "\n");
    }
    std::fclose(f);
  }
  return 0;
}

TEST(EngineTest, TensorParallelMatchesSerial) {
  auto results = comm::testing::RunWorkers(2, "engine_tp", absl::Seconds(180));
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  for (const auto& [name, config, int8] : TpCases()) {
    SCOPED_TRACE(name);
    const auto requests = MixedRequests(6, 257);
    auto serial = Alone(config, requests, int8);
    ASSERT_TRUE(serial.ok()) << serial.status();
    FILE* f = std::fopen(ResultPath(name).c_str(), "r");
    ASSERT_NE(f, nullptr);
    for (size_t i = 0; i < requests.size(); ++i) {
      // Greedy requests (every fourth) must pick the same tokens; sampled
      // ones draw from distributions within fp32 reduction-order error and
      // land on the same tokens unless a draw falls within that error of a
      // boundary (fixed seeds: checked once).
      size_t n = 0;
      ASSERT_EQ(std::fscanf(f, "%zu", &n), 1);
      ASSERT_EQ(n, (*serial)[i].tokens.size()) << "request " << i;
      for (size_t j = 0; j < n; ++j) {
        long long token = 0;
        double logprob = 0;
        ASSERT_EQ(std::fscanf(f, "%lld %lf", &token, &logprob), 2);
        EXPECT_EQ(token, (*serial)[i].tokens[j]) << "request " << i;
        EXPECT_NEAR(logprob, (*serial)[i].logprobs[j], 1e-4) << "request " << i;
      }
    }
    std::fclose(f);
  }
}

}  // namespace
}  // namespace inference
}  // namespace mcc
