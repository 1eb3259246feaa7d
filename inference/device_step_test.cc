// The engine's device path (DeviceStep) on the test device against the CPU
// engine on the same weights: greedy tokens equal (fp32 weights), logits
// within a stated bound (fp32 and bf16), prefill through flash attention
// against the paged kernel, batched against alone (bit for bit
// with batch_invariant), a request longer than the pool refused as the
// client's fault, and a model too big for the device refused before any
// device allocation, with the figures; int8 and FP8 weights give the CPU
// engine's greedy tokens at half of bf16's linear-layer bytes.
#include "inference/device_step.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/ops/attention.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "core/testing/test_device.h"
#include "data/tokenizer.h"
#include "gtest/gtest.h"
#include "inference/engine.h"
#include "inference/inference_weights.h"
#include "inference/model_runner.h"
#include "models/gpt/fp8_quantization.h"
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
  c.vocab_size = 264;
  c.seq_length = 48;
  c.seed = 11;
  return c;
}

std::vector<std::pair<std::string, gpt::GPTConfig>> Variants() {
  std::vector<std::pair<std::string, gpt::GPTConfig>> v;
  v.push_back({"learned_layernorm_gelu", TinyConfig()});
  gpt::GPTConfig rope = TinyConfig();
  rope.position_embedding = gpt::PositionEmbedding::kRope;
  rope.normalization = gpt::Normalization::kRMSNorm;
  rope.untie_embeddings_and_output_weights = true;
  rope.add_bias_linear = false;
  v.push_back({"rope_rmsnorm_untied_nobias", rope});
  gpt::GPTConfig llama = rope;
  llama.num_query_groups = 2;
  llama.activation = gpt::Activation::kSwiGLU;
  v.push_back({"llama_gqa_swiglu", llama});
  gpt::GPTConfig qwen = rope;
  qwen.num_query_groups = 2;
  qwen.add_qkv_bias = true;
  qwen.qk_layernorm = true;
  qwen.rope_scaling.enabled = true;
  qwen.rope_scaling.original_max_position_embeddings = 4;
  v.push_back({"qwen_qk_norm_qkv_bias_rope_scaling", qwen});
  // Mistral: a window of 6 positions, shorter than the prompts and the
  // generations, so the engine frees blocks behind it.
  gpt::GPTConfig mistral = llama;
  mistral.window_left = 5;
  v.push_back({"mistral_sliding_window", mistral});
  // Qwen2-MoE-like: 4 experts, top-2, a gated shared expert, expert bias,
  // a dense first layer.
  gpt::GPTConfig moe = llama;
  moe.num_experts = 4;
  moe.moe_router_topk = 2;
  moe.moe_ffn_hidden_size = 48;
  moe.moe_layer_freq = "[0,1]";
  moe.moe_shared_expert_intermediate_size = 32;
  moe.moe_shared_expert_gate = true;
  moe.moe_router_enable_expert_bias = true;
  moe.moe_router_score_function = ops::MoeScoreFunction::kSigmoid;
  v.push_back({"qwen_moe_shared_gate", moe});
  return v;
}

// The model's weights, its linear layers quantised as eval/serve --quantize
// does ("int8", "fp8", "fp8-per-tensor"; "" none).
absl::StatusOr<InferenceWeights> Weights(const gpt::GPTConfig& config,
                                         const std::string& quantize = "") {
  parallel::LayerContext ctx;
  ctx.seed = config.seed;
  MCC_ASSIGN_OR_RETURN(auto model, gpt::GPTModel::Create(config, ctx));
  if (quantize == "int8") {
    MCC_RETURN_IF_ERROR(gpt::QuantizeLinearWeightsInt8(model.get()));
  } else if (!quantize.empty()) {
    MCC_RETURN_IF_ERROR(gpt::QuantizeLinearWeightsFp8(
        model.get(), quantize == "fp8" ? ops::Fp8WeightScaling::kPerChannel
                                       : ops::Fp8WeightScaling::kPerTensor));
  }
  return LoadInferenceWeights(*model);
}

constexpr int64_t kBlocks = 64, kBlockSize = 4;

// A runner on the CPU (device null) or on the test device.
absl::StatusOr<std::unique_ptr<ModelRunner>> MakeRunner(
    const gpt::GPTConfig& config, const DeviceStepOptions* device,
    const std::string& quantize = "") {
  MCC_ASSIGN_OR_RETURN(InferenceWeights w, Weights(config, quantize));
  const KvCacheShape shape = CacheShapeFor(w, kBlockSize);
  if (device == nullptr) {
    return std::make_unique<ModelRunner>(
        std::move(w), nullptr, PagedKvCache::WithBlocks(shape, kBlocks));
  }
  MCC_ASSIGN_OR_RETURN(auto step,
                       DeviceStep::Create(w, shape, kBlocks, *device));
  return std::make_unique<ModelRunner>(
      std::move(w), std::move(step),
      PagedKvCache::BookkeepingOnly(shape, kBlocks));
}

DeviceStepOptions TestDevice(DType dtype, bool batch_invariant = false) {
  DeviceStepOptions o;
  o.device = Device::TestDevice();
  o.dtype = dtype;
  o.batch_invariant = batch_invariant;
  return o;
}

struct Run {
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<LocalStepExecutor> executor;
  std::unique_ptr<Engine> engine;
};

absl::StatusOr<Run> MakeEngine(const gpt::GPTConfig& config,
                               const DeviceStepOptions* device,
                               int max_batch_size,
                               const std::string& quantize = "") {
  Run run;
  MCC_ASSIGN_OR_RETURN(run.runner, MakeRunner(config, device, quantize));
  run.executor = std::make_unique<LocalStepExecutor>(run.runner.get());
  EngineOptions options;
  options.scheduler.max_batch_size = max_batch_size;
  options.scheduler.prefill_chunk_size = 8;
  options.max_positions = config.max_positions();
  options.model_vocab = config.vocab_size;
  options.scheduler.window_left = config.window_left;
  run.engine =
      std::make_unique<Engine>(options, run.executor.get(),
                               &run.runner->cache(), data::MakeByteTokenizer());
  return run;
}

std::vector<GenerationRequest> GreedyRequests(int n, int64_t vocab) {
  std::mt19937 rng(7);
  std::vector<GenerationRequest> out;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    const int len = 1 + rng() % 17;
    for (int j = 0; j < len; ++j) r.prompt.push_back(rng() % 256);
    r.max_new_tokens = 4 + rng() % 10;
    r.stop_at_eod = false;
    r.sampling.temperature = 0;
    r.prompt_logprobs = true;
    out.push_back(r);
  }
  (void)vocab;
  return out;
}

absl::StatusOr<std::vector<GenerationEvent>> RunAll(
    Engine* engine, const std::vector<GenerationRequest>& requests) {
  std::vector<GenerationEvent> results(requests.size());
  size_t done = 0;
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
  for (int steps = 0; done < requests.size(); ++steps) {
    MCC_ASSIGN_OR_RETURN(bool worked, engine->Step());
    if (!worked || steps > 10000) {
      return absl::InternalError("the engine stopped with requests left");
    }
  }
  return results;
}

// The same greedy tokens request by request, prompt log-probabilities
// within 1e-4 (fp32 sums in other orders).
void ExpectSameGreedyAnswers(const std::vector<GenerationEvent>& got,
                             const std::vector<GenerationEvent>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    ASSERT_EQ(got[i].prompt_logprobs.size(), want[i].prompt_logprobs.size());
    for (size_t j = 0; j < want[i].prompt_logprobs.size(); ++j) {
      EXPECT_NEAR(got[i].prompt_logprobs[j], want[i].prompt_logprobs[j], 1e-4)
          << "request " << i << " position " << j;
    }
  }
}

// Six greedy requests through the CPU engine and the test device's (fp32,
// weights quantised as `quantize` says on both): the same answers. The
// device engine is handed back through `device_engine` when given.
void ExpectDeviceAnswersAsCpu(const gpt::GPTConfig& config,
                              const std::string& quantize,
                              Run* device_engine = nullptr) {
  const std::vector<GenerationRequest> requests =
      GreedyRequests(6, config.vocab_size);
  auto cpu = MakeEngine(config, nullptr, 4, quantize);
  const DeviceStepOptions o = TestDevice(DType::kFloat32);
  auto dev = MakeEngine(config, &o, 4, quantize);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(dev.ok()) << dev.status();
  auto want = RunAll(cpu->engine.get(), requests);
  auto got = RunAll(dev->engine.get(), requests);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameGreedyAnswers(*got, *want);
  if (device_engine != nullptr) *device_engine = std::move(*dev);
}

// One prefill step of `prompt` through a runner: the logits of every row.
absl::StatusOr<std::vector<float>> PrefillLogits(
    ModelRunner* runner, const std::vector<int64_t>& prompt) {
  StepRows rows;
  BlockTable table;
  if (!runner->cache().Allocate(
          runner->cache().BlocksFor(static_cast<int64_t>(prompt.size())),
          &table)) {
    return absl::InternalError("no blocks");
  }
  rows.tables.push_back(table);
  for (size_t i = 0; i < prompt.size(); ++i) {
    rows.tokens.push_back(prompt[i]);
    rows.positions.push_back(static_cast<int64_t>(i));
    rows.table.push_back(0);
    rows.logit_rows.push_back(static_cast<int32_t>(i));
  }
  std::vector<float> hidden;
  auto logits = runner->Run(rows, &hidden);
  runner->cache().Free(&rows.tables[0]);
  return logits;
}

// The largest |device - cpu| over the logits of a 20-token prefill, and the
// largest |cpu| (the scale the bound is taken against).
void LogitGap(const gpt::GPTConfig& config, DType dtype, double* gap,
              double* scale) {
  auto cpu = MakeRunner(config, nullptr);
  const DeviceStepOptions o = TestDevice(dtype);
  auto dev = MakeRunner(config, &o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(dev.ok()) << dev.status();
  std::vector<int64_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back((i * 37 + 5) % 256);
  auto want = PrefillLogits(cpu->get(), prompt);
  auto got = PrefillLogits(dev->get(), prompt);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(want->size(), got->size());
  *gap = 0;
  *scale = 0;
  for (size_t i = 0; i < want->size(); ++i) {
    *gap = std::max(*gap, std::fabs(double{(*got)[i]} - (*want)[i]));
    *scale = std::max(*scale, std::fabs(double{(*want)[i]}));
  }
}

TEST(DeviceStepTest, Fp32LogitsAgreeWithTheCpuEngineToRounding) {
  for (const auto& [name, config] : Variants()) {
    SCOPED_TRACE(name);
    double gap = 0, scale = 0;
    LogitGap(config, DType::kFloat32, &gap, &scale);
    std::printf("%s fp32: max |logit gap| %.3g, max |logit| %.3g\n",
                name.c_str(), gap, scale);
    // fp32 throughout; only the summation orders differ.
    EXPECT_LE(gap, 1e-5 * std::max(1.0, scale)) << "scale " << scale;
  }
}

TEST(DeviceStepTest, Bf16LogitsWithinBf16Rounding) {
  for (const auto& [name, config] : Variants()) {
    SCOPED_TRACE(name);
    double gap = 0, scale = 0;
    LogitGap(config, DType::kBFloat16, &gap, &scale);
    std::printf("%s bf16: max |logit gap| %.3g, max |logit| %.3g\n",
                name.c_str(), gap, scale);
    // Weights and GEMM inputs rounded to bf16 (relative 2^-9 each) through
    // two layers: measured 0.4% of the largest logit here; bound 1%.
    EXPECT_LE(gap, 0.01 * std::max(1.0, scale)) << "scale " << scale;
    EXPECT_GT(gap, 0.0) << "bf16 weights should move the logits";
  }
}

TEST(DeviceStepTest, GreedyTokensEqualTheCpuEngines) {
  for (const auto& [name, config] : Variants()) {
    SCOPED_TRACE(name);
    inference::Run dev;
    ExpectDeviceAnswersAsCpu(config, "", &dev);
    ASSERT_NE(dev.runner, nullptr);
    // Prompts' first chunks went through flash attention, up to 4 requests
    // a step (the rest through the paged kernel).
    EXPECT_GT(dev.runner->device_step()->flash_prefill_rows(), 0);
  }
}

// Runners on the test device with flash prefill on and off.
struct FlashAndPaged {
  std::unique_ptr<ModelRunner> flash, paged;
};
absl::StatusOr<FlashAndPaged> FlashAndPagedRunners(const gpt::GPTConfig& config,
                                                   DType dtype) {
  const DeviceStepOptions flash = TestDevice(dtype);
  DeviceStepOptions paged = flash;
  paged.flash_prefill = false;
  FlashAndPaged runners;
  MCC_ASSIGN_OR_RETURN(runners.flash, MakeRunner(config, &flash));
  MCC_ASSIGN_OR_RETURN(runners.paged, MakeRunner(config, &paged));
  return runners;
}

// Two steps through a runner: request 0's first 6 prompt tokens, then a
// step of three new prompts of 7, 1 and 11 tokens (flash prefill) with
// request 0's next 4 tokens (after its cached prefix: the paged kernel)
// among them; every row's logits of both steps.
absl::StatusOr<std::vector<float>> MixedPrefillLogits(ModelRunner* runner) {
  const std::vector<int64_t> lengths = {10, 7, 1, 11};
  std::vector<BlockTable> tables(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (!runner->cache().Allocate(runner->cache().BlocksFor(lengths[i]),
                                  &tables[i])) {
      return absl::InternalError("no blocks");
    }
  }
  auto add = [&](StepRows* rows, int request, int64_t begin, int64_t end) {
    rows->tables.push_back(tables[request]);
    for (int64_t p = begin; p < end; ++p) {
      rows->logit_rows.push_back(static_cast<int32_t>(rows->rows()));
      rows->tokens.push_back((request * 71 + p * 37 + 5) % 256);
      rows->positions.push_back(p);
      rows->table.push_back(static_cast<int32_t>(rows->tables.size() - 1));
    }
  };
  StepRows first, mixed;
  add(&first, 0, 0, 6);
  add(&mixed, 1, 0, 7);
  add(&mixed, 0, 6, 10);
  add(&mixed, 2, 0, 1);
  add(&mixed, 3, 0, 11);
  std::vector<float> out, hidden;
  for (const StepRows* rows : {&first, &mixed}) {
    MCC_ASSIGN_OR_RETURN(const std::vector<float> logits,
                         runner->Run(*rows, &hidden));
    out.insert(out.end(), logits.begin(), logits.end());
  }
  for (BlockTable& t : tables) runner->cache().Free(&t);
  return out;
}

// The largest |got - want| and the largest |want|.
void Gap(const std::vector<float>& got, const std::vector<float>& want,
         double* gap, double* scale) {
  ASSERT_EQ(got.size(), want.size());
  *gap = 0;
  *scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    *gap = std::max(*gap, std::fabs(double{got[i]} - want[i]));
    *scale = std::max(*scale, std::fabs(double{want[i]}));
  }
}

// Prompt rows through flash attention (several requests of different
// lengths packed in one step, a sliding window in the Mistral variant,
// a chunk after a cached prefix among them) against every row through the
// paged kernel, and in fp32 against the CPU engine.
TEST(DeviceStepTest, FlashPrefillGivesThePagedPathsLogits) {
  for (const auto& [name, config] : Variants()) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat(name, " ", DTypeName(dtype)));
      auto runners = FlashAndPagedRunners(config, dtype);
      ASSERT_TRUE(runners.ok()) << runners.status();
      auto got = MixedPrefillLogits(runners->flash.get());
      auto want = MixedPrefillLogits(runners->paged.get());
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(want.ok()) << want.status();
      // 6 rows of the first step, 7 + 1 + 11 of the second.
      EXPECT_EQ(runners->flash->device_step()->flash_prefill_rows(), 25);
      EXPECT_EQ(runners->paged->device_step()->flash_prefill_rows(), 0);
      double gap = 0, scale = 0;
      Gap(*got, *want, &gap, &scale);
      std::printf(
          "%s %s: flash prefill against paged: max |logit gap| %.3g, "
          "max |logit| %.3g\n",
          name.c_str(), std::string(DTypeName(dtype)).c_str(), gap, scale);
      if (dtype == DType::kFloat32) {
        // fp32 attention both ways: only the summation orders differ.
        EXPECT_LE(gap, 1e-5 * std::max(1.0, scale)) << "scale " << scale;
        auto cpu_runner = MakeRunner(config, nullptr);
        ASSERT_TRUE(cpu_runner.ok()) << cpu_runner.status();
        auto cpu = MixedPrefillLogits(cpu_runner->get());
        ASSERT_TRUE(cpu.ok()) << cpu.status();
        Gap(*got, *cpu, &gap, &scale);
        EXPECT_LE(gap, 1e-5 * std::max(1.0, scale)) << "scale " << scale;
      } else {
        // q, k and v rounded to bf16 for the flash kernel (the paged
        // kernel reads them in fp32): measured 0.16% to 0.25% of the
        // largest logit here; bound 0.5%.
        EXPECT_LE(gap, 0.005 * std::max(1.0, scale)) << "scale " << scale;
      }
    }
  }
}

// Each flash-attention call of the test below: its first_key's device and
// address.
struct FlashCall {
  Device device;
  const void* first_key;
};
std::vector<FlashCall>* flash_calls = nullptr;

// The test device's flash-attention forward while the test below runs:
// records the call, then runs the CPU kernel on host views, as the test
// device does without a kernel of its own.
absl::Status RecordingFlashForward(const Tensor& q, const Tensor& k,
                                   const Tensor& v,
                                   const ops::AttentionOptions& options,
                                   Tensor* out, Tensor* lse) {
  flash_calls->push_back(
      {options.first_key.device(), options.first_key.raw_data()});
  MCC_ASSIGN_OR_RETURN(ops::FlashAttentionForwardKernel cpu,
                       ops::FlashAttentionForwardKernels().Get(Device::CPU()));
  ops::AttentionOptions host = options;
  host.first_key = HostView(options.first_key);
  Tensor host_out = HostView(*out), host_lse = HostView(*lse);
  return cpu(HostView(q), HostView(k), HostView(v), host, &host_out, &host_lse);
}

// The packed prompts' first keys go to the device once a step, not once a
// layer: every layer's flash call of a step gets the same tensor on the
// device (the CUDA slot uses such a one as it is and copies only a host
// one), and a step makes one host-to-device copy more than the same step
// through the paged kernel, with three layers.
TEST(DeviceStepTest, FlashPrefillUploadsTheFirstKeysOnceAStep) {
  gpt::GPTConfig config = TinyConfig();
  config.num_layers = 3;
  auto runners = FlashAndPagedRunners(config, DType::kFloat32);
  ASSERT_TRUE(runners.ok()) << runners.status();

  const DeviceType type = Device::TestDevice().type;
  auto& slot = ops::FlashAttentionForwardKernels();
  ASSERT_FALSE(slot.HasKernel(type));
  std::vector<FlashCall> calls;
  flash_calls = &calls;
  slot.Register(type, &RecordingFlashForward);
  int64_t before = testing::TestDeviceCopiesFromHost();
  auto got = MixedPrefillLogits(runners->flash.get());
  const int64_t flash_copies = testing::TestDeviceCopiesFromHost() - before;
  slot.Register(type, nullptr);
  flash_calls = nullptr;
  before = testing::TestDeviceCopiesFromHost();
  auto want = MixedPrefillLogits(runners->paged.get());
  const int64_t paged_copies = testing::TestDeviceCopiesFromHost() - before;
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();

  // Two steps of three layers each.
  ASSERT_EQ(calls.size(), 6u);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].device.ToString(), Device::TestDevice().ToString())
        << "call " << i;
    EXPECT_EQ(calls[i].first_key, calls[i - i % 3].first_key)
        << "call " << i << " got another first_key than its step's first";
  }
  EXPECT_EQ(flash_copies, paged_copies + 2)
      << "host-to-device copies: flash " << flash_copies << ", paged "
      << paged_copies;
  double gap = 0, scale = 0;
  Gap(*got, *want, &gap, &scale);
  EXPECT_LE(gap, 1e-5 * std::max(1.0, scale));
}

// Quantised weights on the device (int8 values or E4M3 codes, decoded in
// the GEMMs' loads) against the CPU engine on the same quantised model:
// the same greedy tokens, prompt log-probabilities within fp32 rounding of
// the sums' order, and the linear layers' bytes a quarter of fp32's (half
// of bf16's) plus the scales.
TEST(DeviceStepTest, QuantisedWeightsGiveTheCpuEnginesTokens) {
  for (const std::string quantize : {"int8", "fp8", "fp8-per-tensor"}) {
    for (const auto& [name, config] : Variants()) {
      // Weight-only quantisation does not cover MoE layers (refused by
      // name, on the CPU too).
      if (config.num_experts > 0) continue;
      SCOPED_TRACE(absl::StrCat(quantize, " ", name));
      inference::Run dev;
      ExpectDeviceAnswersAsCpu(config, quantize, &dev);
      ASSERT_NE(dev.runner, nullptr);
      auto weights = Weights(config, quantize);
      ASSERT_TRUE(weights.ok());
      const LinearWeightBytes bytes =
          DeviceLinearWeightBytes(*weights, DType::kBFloat16);
      int64_t elements = 0, rows = 0;
      for (const LayerWeights& lw : weights->layers) {
        for (const LinearWeights* lin : {&lw.qkv, &lw.proj, &lw.fc1, &lw.fc2}) {
          elements += lin->out * lin->in;
          rows += lin->out;
        }
      }
      EXPECT_EQ(bytes.dense, 2 * elements);
      EXPECT_EQ(bytes.stored, elements + 4 * rows);
      EXPECT_EQ(dev.runner->device_step()->weight_bytes(),
                DeviceWeightBytes(*weights, DType::kFloat32));
      EXPECT_STREQ(LinearWeightsFormat(*weights),
                   quantize == "int8" ? "int8" : "FP8 (E4M3)");
    }
  }
}

// Quantised layers keep batch_invariant's promise: batched equals alone bit
// for bit.
TEST(DeviceStepTest, QuantisedBatchInvariantBatchedEqualsAlone) {
  const gpt::GPTConfig config = Variants()[2].second;  // Llama-shaped.
  for (const std::string quantize : {"int8", "fp8"}) {
    SCOPED_TRACE(quantize);
    const std::vector<GenerationRequest> requests =
        GreedyRequests(5, config.vocab_size);
    const DeviceStepOptions o = TestDevice(DType::kBFloat16, true);
    auto batched = MakeEngine(config, &o, 4, quantize);
    ASSERT_TRUE(batched.ok()) << batched.status();
    auto together = RunAll(batched->engine.get(), requests);
    ASSERT_TRUE(together.ok()) << together.status();
    for (size_t i = 0; i < requests.size(); ++i) {
      auto single = MakeEngine(config, &o, 1, quantize);
      ASSERT_TRUE(single.ok()) << single.status();
      auto alone = RunAll(single->engine.get(), {requests[i]});
      ASSERT_TRUE(alone.ok()) << alone.status();
      EXPECT_EQ((*alone)[0].tokens, (*together)[i].tokens) << "request " << i;
      EXPECT_EQ((*alone)[0].prompt_logprobs, (*together)[i].prompt_logprobs)
          << "request " << i;
    }
  }
}

TEST(DeviceStepTest, BatchInvariantModeGivesTheSameBitsBatchedOrAlone) {
  // The Llama-like model in both dtypes, the MoE one in bf16 (its experts'
  // row counts change with the batch).
  for (const auto& [config, dtype] :
       {std::pair{Variants()[2].second, DType::kFloat32},
        std::pair{Variants()[2].second, DType::kBFloat16},
        std::pair{Variants()[5].second, DType::kBFloat16}}) {
    SCOPED_TRACE(::testing::Message()
                 << DTypeName(dtype) << " experts " << config.num_experts);
    const std::vector<GenerationRequest> requests =
        GreedyRequests(5, config.vocab_size);
    const DeviceStepOptions o = TestDevice(dtype, /*batch_invariant=*/true);
    auto batched = MakeEngine(config, &o, 8);
    ASSERT_TRUE(batched.ok()) << batched.status();
    auto together = RunAll(batched->engine.get(), requests);
    ASSERT_TRUE(together.ok()) << together.status();
    // Every row through the paged kernel (a packed flash kernel's order
    // would depend on the other prompts).
    EXPECT_EQ(batched->runner->device_step()->flash_prefill_rows(), 0);
    for (size_t i = 0; i < requests.size(); ++i) {
      auto alone_engine = MakeEngine(config, &o, 1);
      ASSERT_TRUE(alone_engine.ok());
      auto alone = RunAll(alone_engine->engine.get(), {requests[i]});
      ASSERT_TRUE(alone.ok()) << alone.status();
      EXPECT_EQ((*alone)[0].tokens, (*together)[i].tokens) << i;
      EXPECT_EQ((*alone)[0].logprobs, (*together)[i].logprobs) << i;
      EXPECT_EQ((*alone)[0].prompt_logprobs, (*together)[i].prompt_logprobs)
          << i;
    }
  }
}

// Without batch_invariant nothing is promised; this prints what the test
// device's GEMM (the CPU's) gives, for the README's statement.
TEST(DeviceStepTest, DefaultModeBatchedAgainstAloneIsReported) {
  const gpt::GPTConfig config = Variants()[2].second;
  const std::vector<GenerationRequest> requests =
      GreedyRequests(5, config.vocab_size);
  const DeviceStepOptions o = TestDevice(DType::kBFloat16);
  auto batched = MakeEngine(config, &o, 8);
  ASSERT_TRUE(batched.ok()) << batched.status();
  auto together = RunAll(batched->engine.get(), requests);
  ASSERT_TRUE(together.ok()) << together.status();
  int same_tokens = 0, same_bits = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto alone_engine = MakeEngine(config, &o, 1);
    ASSERT_TRUE(alone_engine.ok());
    auto alone = RunAll(alone_engine->engine.get(), {requests[i]});
    ASSERT_TRUE(alone.ok()) << alone.status();
    same_tokens += (*alone)[0].tokens == (*together)[i].tokens;
    same_bits += (*alone)[0].prompt_logprobs == (*together)[i].prompt_logprobs;
  }
  std::printf(
      "default mode on the test device: %d of %zu requests the same tokens "
      "batched or alone, %d the same log-probability bits\n",
      same_tokens, requests.size(), same_bits);
}

TEST(DeviceStepTest, ARequestLongerThanThePoolIsTheClientsFault) {
  const gpt::GPTConfig config = TinyConfig();
  const DeviceStepOptions o = TestDevice(DType::kBFloat16);
  auto weights = Weights(config);
  ASSERT_TRUE(weights.ok());
  const KvCacheShape shape = CacheShapeFor(*weights, kBlockSize);
  auto step = DeviceStep::Create(*weights, shape, 2, o);  // 8 positions
  ASSERT_TRUE(step.ok()) << step.status();
  ModelRunner runner(std::move(*weights), std::move(*step),
                     PagedKvCache::BookkeepingOnly(shape, 2));
  LocalStepExecutor executor(&runner);
  EngineOptions options;
  options.max_positions = config.max_positions();
  options.model_vocab = config.vocab_size;
  Engine engine(options, &executor, &runner.cache(), nullptr);
  GenerationRequest r;
  r.prompt.assign(6, 65);
  r.max_new_tokens = 5;
  const absl::Status s =
      engine.Submit(r, [](const GenerationEvent&) {}).status();
  // InvalidArgument: the HTTP front end answers 400.
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("pool holds only 2"), std::string::npos) << s;
  r.max_new_tokens = 2;  // 8 positions: fits, and runs.
  auto done = RunAll(&engine, {r});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ((*done)[0].tokens.size(), 2u);
}

TEST(DeviceStepTest, AModelTooBigForTheDeviceIsRefusedBeforeAnyAllocation) {
  const gpt::GPTConfig config = TinyConfig();
  auto weights = Weights(config);
  ASSERT_TRUE(weights.ok());
  const KvCacheShape shape = CacheShapeFor(*weights, kBlockSize);
  DeviceStepOptions o = TestDevice(DType::kBFloat16);
  const int64_t need = DeviceWeightBytes(*weights, DType::kBFloat16);
  o.memory_bytes = need / 2;
  const MemoryStats before = GetAllocator(o.device)->Stats();
  auto step = DeviceStep::Create(*weights, shape, kBlocks, o, "ckpt/");
  const MemoryStats after = GetAllocator(o.device)->Stats();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string m(step.status().message());
  EXPECT_NE(m.find(absl::StrCat("ckpt/ needs ", FormatBytes(need),
                                " of bf16 "
                                "weights")),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(absl::StrCat(FormatBytes(need / 2), " free")),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("the weights alone do not fit"), std::string::npos) << m;
  EXPECT_EQ(after.total_allocations, before.total_allocations);
  // Weights that fit with a pool that does not: the KV cache is named.
  o.memory_bytes = need + shape.BlockBytes();
  step = DeviceStep::Create(*weights, shape, kBlocks, o);
  ASSERT_FALSE(step.ok());
  EXPECT_NE(step.status().message().find("lower --kv-cache-bytes"),
            std::string::npos)
      << step.status();
}

// The test-only random model (tools/gpu's serving check): a Llama-shaped
// model with no checkpoint runs greedy requests with finite log-probabilities
// and reports its weights' bytes as the shapes give them.
TEST(DeviceStepTest, RandomWeightsMadeOnTheDeviceRun) {
  gpt::GPTConfig c = Variants()[2].second;  // RoPE, GQA, SwiGLU, untied
  c.ffn_hidden_size = 96;
  const InferenceWeights shapes = WeightShapes(c);
  const KvCacheShape shape = CacheShapeFor(shapes, kBlockSize);
  const DeviceStepOptions o = TestDevice(DType::kBFloat16);
  auto step = DeviceStep::CreateRandom(shapes, shape, kBlocks, o, 7);
  ASSERT_TRUE(step.ok()) << step.status();
  const int64_t h = c.hidden_size, v = c.padded_vocab_size(1);
  const int64_t per_layer = (64 + 2 * 32) * h + h * h + 2 * 96 * h + h * 96;
  EXPECT_EQ((*step)->weight_bytes(),
            2 * (c.num_layers * per_layer + 2 * v * h) +
                4 * (2 * c.num_layers * h + h));
  ModelRunner runner(shapes, std::move(*step),
                     PagedKvCache::BookkeepingOnly(shape, kBlocks));
  LocalStepExecutor executor(&runner);
  EngineOptions options;
  options.scheduler.max_batch_size = 4;
  options.max_positions = c.max_positions();
  options.model_vocab = c.vocab_size;
  Engine engine(options, &executor, &runner.cache(), nullptr);
  auto done = RunAll(&engine, GreedyRequests(3, c.vocab_size));
  ASSERT_TRUE(done.ok()) << done.status();
  for (const GenerationEvent& e : *done) {
    EXPECT_FALSE(e.tokens.empty());
    for (double lp : e.prompt_logprobs) EXPECT_TRUE(std::isfinite(lp));
  }
  // Too big: refused before any allocation, as for real weights.
  DeviceStepOptions small = o;
  small.memory_bytes = 1000;
  EXPECT_EQ(DeviceStep::CreateRandom(shapes, shape, kBlocks, small, 7)
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
}

// Decode steps as device graphs (captured on the test device, replayed as
// recorded calls): with batch-invariant GEMMs every request's tokens and
// log-probabilities equal the eager engine's bit for bit, padding rows
// included (3 running sequences replay the graph of 4), and steps do
// replay.
// Random weights quantised on the device (serve --random-weights
// --quantize): the bytes counted as stored, and the logits near the dense
// random model's (the same draws), within the quantisation's error.
TEST(DeviceStepTest, RandomWeightsQuantisedOnTheDevice) {
  gpt::GPTConfig c = Variants()[2].second;  // RoPE, GQA, SwiGLU, untied
  c.ffn_hidden_size = 96;
  const InferenceWeights shapes = WeightShapes(c);
  const KvCacheShape shape = CacheShapeFor(shapes, kBlockSize);
  const DeviceStepOptions o = TestDevice(DType::kBFloat16);
  std::vector<int64_t> prompt;
  for (int i = 0; i < 12; ++i) prompt.push_back((i * 53 + 3) % 256);
  auto dense_step = DeviceStep::CreateRandom(shapes, shape, kBlocks, o, 7);
  ASSERT_TRUE(dense_step.ok()) << dense_step.status();
  ModelRunner dense(shapes, std::move(*dense_step),
                    PagedKvCache::BookkeepingOnly(shape, kBlocks));
  auto want = PrefillLogits(&dense, prompt);
  ASSERT_TRUE(want.ok()) << want.status();
  for (RandomQuantize q :
       {RandomQuantize::kInt8, RandomQuantize::kFp8PerChannel,
        RandomQuantize::kFp8PerTensor}) {
    SCOPED_TRACE(static_cast<int>(q));
    auto step = DeviceStep::CreateRandom(shapes, shape, kBlocks, o, 7, q);
    ASSERT_TRUE(step.ok()) << step.status();
    const LinearWeightBytes linear =
        RandomLinearWeightBytes(shapes, DType::kBFloat16, q);
    // One byte a weight and an fp32 scale a row, against two bytes a weight.
    const int64_t h = c.hidden_size, v = c.padded_vocab_size(1);
    const int64_t per_layer = (64 + 2 * 32) * h + h * h + 2 * 96 * h + h * 96;
    const int64_t rows_per_layer = (64 + 2 * 32) + h + 2 * 96 + h;
    EXPECT_EQ(linear.dense, 2 * c.num_layers * per_layer);
    EXPECT_EQ(linear.stored, c.num_layers * (per_layer + 4 * rows_per_layer));
    EXPECT_EQ((*step)->weight_bytes(),
              linear.stored + 2 * (2 * v * h) + 4 * (2 * c.num_layers * h + h));
    ModelRunner runner(shapes, std::move(*step),
                       PagedKvCache::BookkeepingOnly(shape, kBlocks));
    auto got = PrefillLogits(&runner, prompt);
    ASSERT_TRUE(got.ok()) << got.status();
    double gap = 0, scale = 0;
    for (size_t i = 0; i < want->size(); ++i) {
      gap = std::max(gap, std::fabs(double{(*got)[i]} - (*want)[i]));
      scale = std::max(scale, std::fabs(double{(*want)[i]}));
    }
    std::printf("random weights quantised (%d): max |logit gap| %.3g of %.3g\n",
                static_cast<int>(q), gap, scale);
    EXPECT_GT(gap, 0.0);
    EXPECT_LE(gap, 0.05 * scale);
  }
  EXPECT_FALSE(RandomQuantizeFromFlag("int4").ok());
}

TEST(DeviceStepTest, DecodeGraphsGiveTheEagerBits) {
  const gpt::GPTConfig config = Variants()[3].second;  // Qwen-like
  const std::vector<GenerationRequest> requests =
      GreedyRequests(5, config.vocab_size);
  DeviceStepOptions eager = TestDevice(DType::kBFloat16, true);
  DeviceStepOptions graphed = eager;
  graphed.graph_batch_sizes = {1, 2, 4};
  auto want_engine = MakeEngine(config, &eager, 3);
  auto got_engine = MakeEngine(config, &graphed, 3);
  ASSERT_TRUE(want_engine.ok()) << want_engine.status();
  ASSERT_TRUE(got_engine.ok()) << got_engine.status();
  auto want = RunAll(want_engine->engine.get(), requests);
  auto got = RunAll(got_engine->engine.get(), requests);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << i;
    EXPECT_EQ((*got)[i].logprobs, (*want)[i].logprobs) << i;
    EXPECT_EQ((*got)[i].prompt_logprobs, (*want)[i].prompt_logprobs) << i;
  }
  const int64_t replays = got_engine->runner->device_step()->graph_replays();
  std::printf("decode steps replayed from graphs: %lld\n",
              static_cast<long long>(replays));
  EXPECT_GT(replays, 10);
  EXPECT_EQ(want_engine->runner->device_step()->graph_replays(), 0);
}

TEST(DeviceStepTest, RefusesPipelineAndTensorParallelWithoutGroup) {
  auto weights = Weights(TinyConfig());
  ASSERT_TRUE(weights.ok());
  const KvCacheShape shape = CacheShapeFor(*weights, kBlockSize);
  // A TP shard needs its TP group (multi-process TP runs in
  // //tools/serve:serve_device_e2e_test).
  InferenceWeights tp = *weights;
  tp.tp_size = 2;
  const absl::Status no_group =
      DeviceStep::Create(tp, shape, 4, TestDevice(DType::kBFloat16)).status();
  EXPECT_EQ(no_group.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_group.message().find("tensor-parallel group of 2"),
            std::string::npos)
      << no_group;
  InferenceWeights stage = *weights;
  stage.post_process = false;
  EXPECT_EQ(DeviceStep::Create(stage, shape, 4, TestDevice(DType::kBFloat16))
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace inference
}  // namespace mcc
