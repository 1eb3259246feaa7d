// Activation offloading (--cpu-offloading, core/activation_offload.h) in the
// GPT on the test device: the losses and every gradient equal the run
// without it bit for bit, serial (with and without recomputation, with
// synchronous copies and with deferred side streams that copy only when
// waited for), under TP 2 + SP and under PP 2 (plain and interleaved) over
// real processes; peak device memory falls by the bytes offloaded, less a
// stated slack; bad settings are named. The log shows step time and peak
// memory with and without it.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/allocator.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "core/testing/deferred_side_stream.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/stage_model.h"
#include "parallel/pipeline/layer_split.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/testing/device_parity.h"

namespace mcc {
namespace gpt {
namespace {

const Device kDev = Device::TestDevice();
constexpr int kMicroBatches = 3;

// Four layers; between them the configurations take every path that saves
// activations: learned positions, LayerNorm, GELU, dropout, a loss mask;
// rotary, RMSNorm, SwiGLU, grouped queries and selective recomputation;
// full recomputation, uniform (chunks of two layers: only the chunk's input
// is saved) and block (the first layer recomputed).
std::vector<std::pair<std::string, GPTConfig>> Configs() {
  GPTConfig a;
  a.num_layers = 4;
  a.hidden_size = 32;
  a.num_attention_heads = 4;
  a.vocab_size = 64;
  a.seq_length = 8;
  a.seed = 5;
  a.hidden_dropout = 0.1;
  a.attention_dropout = 0.1;
  GPTConfig b = a;
  b.position_embedding = PositionEmbedding::kRope;
  b.normalization = Normalization::kRMSNorm;
  b.activation = Activation::kSwiGLU;
  b.ffn_hidden_size = 48;
  b.num_query_groups = 2;
  b.untie_embeddings_and_output_weights = true;
  b.recompute_granularity = RecomputeGranularity::kSelective;
  GPTConfig full = a;
  full.recompute_granularity = RecomputeGranularity::kFull;
  full.recompute_num_layers = 2;
  GPTConfig block = full;
  block.recompute_method = RecomputeMethod::kBlock;
  block.recompute_num_layers = 1;
  return {{"gpt", a},
          {"llama_selective", b},
          {"full_uniform", full},
          {"full_block", block}};
}

MicroBatch Batch(const GPTConfig& c, int64_t batch, uint32_t seed,
                 bool masked) {
  std::mt19937 rng(seed);
  std::vector<int64_t> tokens(batch * c.seq_length), labels(tokens.size());
  std::vector<float> mask(tokens.size());
  for (auto& t : tokens) t = rng() % c.vocab_size;
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i] = i % 5 == 2 ? -100 : static_cast<int64_t>(rng() % c.vocab_size);
    mask[i] = (rng() % 4) / 3.0f;
  }
  MicroBatch b;
  b.tokens = *Tensor::FromInts(tokens, {batch, c.seq_length});
  b.labels = *Tensor::FromInts(labels, {batch, c.seq_length});
  if (masked) b.loss_mask = *Tensor::FromVector(mask, {batch, c.seq_length});
  return b;
}

MicroBatch ToDevice(const MicroBatch& b) {
  MicroBatch out;
  out.tokens = *b.tokens.To(kDev);
  out.labels = *b.labels.To(kDev);
  if (b.loss_mask.defined()) out.loss_mask = *b.loss_mask.To(kDev);
  return out;
}

GPTConfig WithOffload(GPTConfig c, int layers) {
  c.cpu_offloading = layers >= 0;
  c.cpu_offloading_num_layers = std::max(0, layers);
  return c;
}

// What a run leaves: each micro-batch's loss and every gradient as bit
// lines, the offloader's totals, the peak device memory of a micro-batch's
// forward and backward, and the seconds of the fastest micro-batch.
struct Run {
  std::vector<std::string> lines;
  OffloadStats offload;
  int offloaded_layers = 0;
  int64_t peak_bytes = 0;
  int64_t resident_bytes = 0;  // Before the step: weights, grads, batch.
  double seconds = 0;
};

absl::StatusOr<Run> Train(const GPTConfig& c, DType dtype,
                          comm::ProcessGroup* tp, bool sp, int64_t batch = 2) {
  parallel::LayerContext ctx;
  ctx.tp_group = tp;
  ctx.sequence_parallel = sp;
  ctx.dtype = dtype;
  ctx.seed = c.seed;
  ctx.device = kDev;
  MCC_ASSIGN_OR_RETURN(auto model, GPTModel::Create(c, ctx));
  std::vector<MicroBatch> batches;
  for (int i = 0; i < kMicroBatches; ++i) {
    batches.push_back(ToDevice(Batch(c, batch, 40 + i, i == 1)));
  }
  Run run;
  Allocator* allocator = GetAllocator(kDev);
  for (const MicroBatch& b : batches) {
    run.resident_bytes = allocator->Stats().current_bytes;
    allocator->ResetPeak();
    const auto start = std::chrono::steady_clock::now();
    MCC_ASSIGN_OR_RETURN(LossSum loss,
                         model->ForwardBackward(b, 1.0f / kMicroBatches));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    // The fastest micro-batch: the machine is shared.
    run.seconds = run.seconds == 0 ? seconds : std::min(run.seconds, seconds);
    run.peak_bytes = std::max(run.peak_bytes, allocator->Stats().peak_bytes);
    run.lines.push_back(absl::StrCat("loss ", parallel::testing::Bits(loss.sum),
                                     " ",
                                     parallel::testing::Bits(loss.tokens)));
  }
  MCC_RETURN_IF_ERROR(model->FinalizeGradients());
  for (const auto& p : model->parameters()) {
    MCC_ASSIGN_OR_RETURN(std::string line,
                         parallel::testing::BitsLine(p->name, p->main_grad));
    run.lines.push_back(std::move(line));
  }
  run.offload = model->offload_stats();
  run.offloaded_layers = model->num_offloaded_layers();
  return run;
}

// OK when both runs saw the same bits, else the first difference.
absl::Status SameBits(const Run& want, const Run& got) {
  if (want.lines.size() != got.lines.size()) {
    return absl::InternalError(
        absl::StrCat(want.lines.size(), " lines, not ", got.lines.size()));
  }
  for (size_t i = 0; i < want.lines.size(); ++i) {
    if (want.lines[i] != got.lines[i]) {
      return absl::InternalError(
          absl::StrCat("differs from the run without offloading: ",
                       want.lines[i].substr(0, want.lines[i].find(' '))));
    }
  }
  return absl::OkStatus();
}

TEST(GPTOffloadDeviceTest, OffloadingChangesNoBit) {
  for (const auto& [name, config] : Configs()) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat(name, " ", DTypeName(dtype)));
      auto plain = Train(config, dtype, nullptr, false);
      ASSERT_TRUE(plain.ok()) << plain.status();
      for (int layers : {1, 3, 4}) {
        SCOPED_TRACE(absl::StrCat(layers, " layers offloaded"));
        auto off = Train(WithOffload(config, layers), dtype, nullptr, false);
        ASSERT_TRUE(off.ok()) << off.status();
        EXPECT_TRUE(SameBits(*plain, *off).ok()) << SameBits(*plain, *off);
        EXPECT_EQ(off->offloaded_layers, layers);
        EXPECT_GT(off->offload.bytes, 0);
        EXPECT_EQ(off->offload.restored_bytes, off->offload.bytes);
      }
    }
  }
}

// Deferred side streams run each copy only when it is waited for: a
// restore without its wait, or a source freed before its copy, would read
// stale memory here.
TEST(GPTOffloadDeviceTest, DeferredSideStreamsChangeNoBit) {
  for (const auto& [name, config] : Configs()) {
    SCOPED_TRACE(name);
    auto plain = Train(config, DType::kFloat32, nullptr, false);
    ASSERT_TRUE(plain.ok()) << plain.status();
    testing::InstallDeferredSideStreams();
    const int64_t issued = testing::DeferredCopiesIssued();
    auto off = Train(WithOffload(config, 4), DType::kFloat32, nullptr, false);
    testing::RemoveDeferredSideStreams();
    ASSERT_TRUE(off.ok()) << off.status();
    EXPECT_TRUE(SameBits(*plain, *off).ok()) << SameBits(*plain, *off);
    EXPECT_GT(testing::DeferredCopiesIssued(), issued);
  }
  EXPECT_GT(testing::DeferredCopiesMaxQueued(), 1)
      << "the copies never waited in the side stream's queue";
}

// Peak test-device memory of a micro-batch's forward and backward falls by
// the bytes offloaded less a slack of one layer's activations: while layer
// i runs its backward, layer i - 1's come back (the prefetch), so the first
// layer not offloaded runs its backward beside one offloaded layer; with
// every layer offloaded, the last comes back as its backward starts, beside
// the prefetch of the one before (two layers' slack). Prints step time and
// peak memory with and without offloading.
TEST(GPTOffloadDeviceTest, PeakMemoryFallsByTheOffloadedBytes) {
  GPTConfig c;
  c.num_layers = 4;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 128;
  c.seq_length = 64;
  c.seed = 3;
  constexpr int64_t kBatch = 4;
  // The first run warms the thread pool and the allocator up; it is not
  // timed.
  ASSERT_TRUE(Train(c, DType::kFloat32, nullptr, false, kBatch).ok());
  auto plain = Train(c, DType::kFloat32, nullptr, false, kBatch);
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::printf("%-18s %12s %12s %14s\n", "offloaded layers", "ms/micro-batch",
              "peak", "offloaded/mb");
  std::printf("%-18d %12.2f %12s %14s\n", 0, plain->seconds * 1e3,
              FormatBytes(plain->peak_bytes).c_str(), "0");
  for (int layers : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat(layers, " layers offloaded"));
    auto off =
        Train(WithOffload(c, layers), DType::kFloat32, nullptr, false, kBatch);
    ASSERT_TRUE(off.ok()) << off.status();
    ASSERT_TRUE(SameBits(*plain, *off).ok()) << SameBits(*plain, *off);
    EXPECT_EQ(off->resident_bytes, plain->resident_bytes);
    const int64_t per_micro_batch = off->offload.bytes / kMicroBatches;
    const int64_t per_layer = per_micro_batch / layers;
    const int64_t saved = plain->peak_bytes - off->peak_bytes;
    std::printf("%-18d %12.2f %12s %14s\n", layers, off->seconds * 1e3,
                FormatBytes(off->peak_bytes).c_str(),
                FormatBytes(per_micro_batch).c_str());
    std::printf(
        "  peak fell by %s; offloaded %s per micro-batch (%s a layer)\n",
        FormatBytes(saved).c_str(), FormatBytes(per_micro_batch).c_str(),
        FormatBytes(per_layer).c_str());
    // Offloading the last layer too saves nothing more: its activations
    // come back as its backward starts, with the layer before's prefetch.
    const int64_t slack = (layers == c.num_layers ? 2 : 1) * per_layer;
    EXPECT_GE(saved, per_micro_batch - slack);
    EXPECT_EQ(off->offload.kept_tensors, 0);
  }
}

TEST(GPTOffloadDeviceTest, BadSettingsAreNamed) {
  GPTConfig c = Configs()[0].second;
  for (int layers : {-1, 5}) {
    GPTConfig bad = c;
    bad.cpu_offloading = true;
    bad.cpu_offloading_num_layers = layers;
    const absl::Status s = bad.Validate(1, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << layers;
    EXPECT_NE(
        s.message().find(absl::StrCat("--cpu-offloading-num-layers (", layers,
                                      ") must be in [0, --num-layers 4]")),
        std::string::npos)
        << s;
  }
  GPTConfig negative = c;
  negative.cpu_offloading_num_layers = -2;  // Refused even when off.
  EXPECT_FALSE(negative.Validate(1, false).ok());
  // On the CPU activations already live in host memory.
  parallel::LayerContext ctx;
  ctx.device = Device::CPU();
  auto cpu = GPTModel::Create(WithOffload(c, 2), ctx);
  ASSERT_FALSE(cpu.ok());
  EXPECT_NE(cpu.status().message().find("--cpu-offloading: the model is on "
                                        "the CPU"),
            std::string::npos)
      << cpu.status();
  // Evaluation offloads nothing.
  ctx.device = kDev;
  auto model = GPTModel::Create(WithOffload(c, 4), ctx);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->Forward(ToDevice(Batch(c, 2, 1, false))).ok());
  EXPECT_EQ((*model)->offload_stats().bytes, 0);
}

// TP 2 + SP: each rank trains with and without offloading over a group that
// moves test-device tensors and compares.
MCC_WORKER(gpt_offload_tp) {
  auto world = parallel::testing::InitParityWorld(kDev);
  if (!world.ok()) {
    std::fprintf(stderr, "init: %s\n", world.status().ToString().c_str());
    return 3;
  }
  for (const auto& [name, config] : Configs()) {
    auto plain = Train(config, DType::kFloat32, world->group.get(), true);
    auto off = Train(WithOffload(config, 3), DType::kFloat32,
                     world->group.get(), true);
    const absl::Status s = !plain.ok() ? plain.status()
                           : !off.ok() ? off.status()
                                       : SameBits(*plain, *off);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), s.ToString().c_str());
      return 4;
    }
    if (off->offload.bytes == 0) {
      std::fprintf(stderr, "%s: nothing was offloaded\n", name.c_str());
      return 5;
    }
  }
  return 0;
}

TEST(GPTOffloadDeviceTest, TensorAndSequenceParallelChangeNoBit) {
  auto results =
      comm::testing::RunWorkers(2, "gpt_offload_tp", absl::Seconds(240));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
}

// PP 2, one chunk of two layers per stage and interleaved (two chunks of
// one layer): each chunk offloads its own first local layer. The lines:
// each micro-batch's loss (last stage), the totals, every gradient after
// the tied embedding's sum.
absl::StatusOr<Run> TrainPipelined(parallel::ParallelState* state,
                                   const GPTConfig& c, bool interleaved) {
  comm::ProcessGroup* pp = state->pipeline();
  parallel::LayerContext ctx;
  ctx.seed = c.seed;
  ctx.device = kDev;
  pipeline::PipelineConfig split;
  split.num_layers = c.num_layers;
  split.pipeline_size = pp->size();
  split.layers_per_virtual_stage = interleaved ? 1 : 0;
  MCC_ASSIGN_OR_RETURN(auto model,
                       StageModel::Create(c, ctx, split, pp->rank()));
  std::vector<MicroBatch> batches;
  for (int i = 0; i < 4; ++i) batches.push_back(Batch(c, 2, 60 + i, i == 2));
  MCC_RETURN_IF_ERROR(model->SetMicroBatches(std::move(batches)));
  pipeline::PipelineOptions schedule;
  MCC_ASSIGN_OR_RETURN(auto executor, pipeline::PipelineExecutor::Create(
                                          model->stages(), pp, schedule));
  MCC_ASSIGN_OR_RETURN(auto result, executor->Run(4, 0.25f));
  MCC_RETURN_IF_ERROR(model->SyncSharedGradients(state->embedding()));
  MCC_RETURN_IF_ERROR(model->FinalizeGradients());
  Run run;
  for (const Tensor& loss : result.microbatch_losses) {
    MCC_ASSIGN_OR_RETURN(std::string line,
                         parallel::testing::BitsLine("loss", loss));
    run.lines.push_back(std::move(line));
  }
  MCC_ASSIGN_OR_RETURN(std::string totals, parallel::testing::BitsLine(
                                               "totals", result.loss_totals));
  run.lines.push_back(std::move(totals));
  for (const auto& p : model->parameters()) {
    MCC_ASSIGN_OR_RETURN(std::string line,
                         parallel::testing::BitsLine(p->name, p->main_grad));
    run.lines.push_back(std::move(line));
  }
  for (GPTModel* chunk : model->chunks()) {
    run.offloaded_layers += chunk->num_offloaded_layers();
    run.offload.bytes += chunk->offload_stats().bytes;
  }
  return run;
}

MCC_WORKER(gpt_offload_pp) {
  parallel::ParallelSizes sizes;
  sizes.pipeline = 2;
  auto job = parallel::testing::InitParityJob(kDev, sizes);
  if (!job.ok()) {
    std::fprintf(stderr, "init: %s\n", job.status().ToString().c_str());
    return 3;
  }
  const auto configs = Configs();
  for (const auto& [name, config] : {configs[0], configs[2]}) {
    for (bool interleaved : {false, true}) {
      const std::string what =
          absl::StrCat(name, interleaved ? " interleaved" : "");
      auto plain = TrainPipelined(job->state.get(), config, interleaved);
      auto off =
          TrainPipelined(job->state.get(), WithOffload(config, 1), interleaved);
      const absl::Status s = !plain.ok() ? plain.status()
                             : !off.ok() ? off.status()
                                         : SameBits(*plain, *off);
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
        return 4;
      }
      // One layer per chunk: each stage's first of two, or each chunk's.
      const int want = interleaved ? 2 : 1;
      if (off->offloaded_layers != want || off->offload.bytes == 0) {
        std::fprintf(stderr, "%s: %d layers offloaded (want %d), %lld bytes\n",
                     what.c_str(), off->offloaded_layers, want,
                     static_cast<long long>(off->offload.bytes));
        return 5;
      }
    }
  }
  return 0;
}

TEST(GPTOffloadDeviceTest, PipelineStagesOffloadTheirOwnLayers) {
  auto results =
      comm::testing::RunWorkers(2, "gpt_offload_pp", absl::Seconds(240));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
