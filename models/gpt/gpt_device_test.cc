// The GPT built on the test device (core/testing/test_device.h: a device
// that is not the host, whose memory the host cannot dereference) trains
// bit for bit as the same model on the CPU: losses and every parameter
// gradient, fp32, bf16 and fp16, serial and tensor + sequence parallel over
// real processes; KV-cache decoding gives the CPU's logits. Each step copies
// device memory to the host exactly once (the loss it returns) and never
// copies from the host, so nothing but kernels, collectives and that read
// touched device memory.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"

namespace mcc {
namespace gpt {
namespace {

constexpr int64_t kBatch = 2;
constexpr int kMicroBatches = 3;

// Two configurations that between them take every path of the model:
// learned positions, LayerNorm, GELU, tied output, dropout, a loss mask;
// rotary, RMSNorm, SwiGLU, grouped queries, untied padded vocabulary,
// selective recomputation.
std::vector<std::pair<std::string, GPTConfig>> Configs() {
  GPTConfig a;
  a.num_layers = 2;
  a.hidden_size = 32;
  a.num_attention_heads = 4;
  a.vocab_size = 64;
  a.seq_length = 8;
  a.seed = 7;
  a.hidden_dropout = 0.1;
  a.attention_dropout = 0.1;
  GPTConfig b = a;
  b.position_embedding = PositionEmbedding::kRope;
  b.normalization = Normalization::kRMSNorm;
  b.activation = Activation::kSwiGLU;
  b.ffn_hidden_size = 48;
  b.num_query_groups = 2;
  b.untie_embeddings_and_output_weights = true;
  b.vocab_size = 50;
  b.make_vocab_size_divisible_by = 16;
  b.recompute_granularity = RecomputeGranularity::kSelective;
  return {{"gpt", a}, {"llama", b}};
}

MicroBatch Batch(const GPTConfig& c, uint32_t seed, bool masked) {
  std::mt19937 rng(seed);
  std::vector<int64_t> tokens(kBatch * c.seq_length), labels(tokens.size());
  std::vector<float> mask(tokens.size());
  for (auto& t : tokens) t = rng() % c.vocab_size;
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i] = i % 5 == 2 ? -100 : static_cast<int64_t>(rng() % c.vocab_size);
    mask[i] = (rng() % 4) / 3.0f;
  }
  MicroBatch b;
  b.tokens = *Tensor::FromInts(tokens, {kBatch, c.seq_length});
  b.labels = *Tensor::FromInts(labels, {kBatch, c.seq_length});
  if (masked) b.loss_mask = *Tensor::FromVector(mask, {kBatch, c.seq_length});
  return b;
}

MicroBatch To(const MicroBatch& b, Device device) {
  MicroBatch out;
  out.tokens = *b.tokens.To(device);
  out.labels = *b.labels.To(device);
  if (b.loss_mask.defined()) out.loss_mask = *b.loss_mask.To(device);
  return out;
}

// What a run leaves: the micro-batches' losses and every gradient (bytes,
// brought to the host after the run).
struct Run {
  std::vector<LossSum> losses;
  std::vector<std::string> names;
  std::vector<Tensor> grads;
};

absl::StatusOr<Run> Train(const GPTConfig& c, DType dtype, Device device,
                          comm::ProcessGroup* tp, bool sp) {
  parallel::LayerContext ctx;
  ctx.tp_group = tp;
  ctx.sequence_parallel = sp;
  ctx.dtype = dtype;
  ctx.seed = c.seed;
  ctx.device = device;
  MCC_ASSIGN_OR_RETURN(auto model, GPTModel::Create(c, ctx));
  for (const auto& p : model->parameters()) {
    if (p->value.device() != device || p->main_grad.device() != device) {
      return absl::InternalError(
          absl::StrCat(p->name, " is not on ", device.ToString()));
    }
  }
  std::vector<MicroBatch> batches;
  for (int i = 0; i < kMicroBatches; ++i) {
    batches.push_back(To(Batch(c, 40 + i, i == 1), device));
  }
  Run run;
  for (const MicroBatch& batch : batches) {
    const int64_t to_host = testing::TestDeviceCopiesToHost();
    const int64_t from_host = testing::TestDeviceCopiesFromHost();
    MCC_ASSIGN_OR_RETURN(LossSum loss,
                         model->ForwardBackward(batch, 1.0f / kMicroBatches));
    if (!device.is_cpu()) {
      // The returned loss is the one read; nothing comes from the host.
      const int64_t up = testing::TestDeviceCopiesToHost() - to_host;
      const int64_t down = testing::TestDeviceCopiesFromHost() - from_host;
      if (up != 1 || down != 0) {
        return absl::InternalError(
            absl::StrCat("a step copied ", up, " times to the host and ", down,
                         " times from it (want 1 and 0)"));
      }
    }
    run.losses.push_back(loss);
  }
  MCC_RETURN_IF_ERROR(model->FinalizeGradients());
  for (const auto& p : model->parameters()) {
    run.names.push_back(p->name);
    MCC_ASSIGN_OR_RETURN(Tensor g, p->main_grad.To(Device::CPU()));
    run.grads.push_back(g);
  }
  return run;
}

// OK when both runs agree bit for bit, else the first difference.
absl::Status SameBits(const Run& cpu, const Run& dev) {
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    if (cpu.losses[i].sum != dev.losses[i].sum ||
        cpu.losses[i].tokens != dev.losses[i].tokens) {
      return absl::InternalError(
          absl::StrCat("micro-batch ", i, ": loss ", cpu.losses[i].sum, " / ",
                       cpu.losses[i].tokens, " on the CPU, ", dev.losses[i].sum,
                       " / ", dev.losses[i].tokens, " on the test device"));
    }
  }
  if (cpu.grads.size() != dev.grads.size()) {
    return absl::InternalError("different parameter lists");
  }
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    const Tensor& a = cpu.grads[i];
    const Tensor& b = dev.grads[i];
    if (a.shape() != b.shape() ||
        std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0) {
      return absl::InternalError(
          absl::StrCat(cpu.names[i],
                       ": gradient differs between the CPU and "
                       "the test device"));
    }
  }
  return absl::OkStatus();
}

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16,
                             DType::kFloat16};

TEST(GPTDeviceTest, TrainsBitForBitAsOnTheCpu) {
  for (const auto& [name, config] : Configs()) {
    for (DType dtype : kDTypes) {
      SCOPED_TRACE(absl::StrCat(name, " ", DTypeName(dtype)));
      auto cpu = Train(config, dtype, Device::CPU(), nullptr, false);
      ASSERT_TRUE(cpu.ok()) << cpu.status();
      auto dev = Train(config, dtype, Device::TestDevice(), nullptr, false);
      ASSERT_TRUE(dev.ok()) << dev.status();
      EXPECT_TRUE(SameBits(*cpu, *dev).ok()) << SameBits(*cpu, *dev);
      // A loss that means something: about log(vocab) at the start.
      EXPECT_GT(cpu->losses[0].mean(), 2.0);
    }
  }
}

// The last position's logits (a forward pass over the whole sequence) come
// back from the device equal to the CPU's.
absl::Status SameLastTokenLogits(const GPTConfig& c, DType dtype,
                                 comm::ProcessGroup* cpu_tp,
                                 comm::ProcessGroup* dev_tp) {
  std::vector<std::vector<Tensor>> logits(2);
  for (int d = 0; d < 2; ++d) {
    const Device device = d == 0 ? Device::CPU() : Device::TestDevice();
    parallel::LayerContext ctx;
    ctx.tp_group = d == 0 ? cpu_tp : dev_tp;
    ctx.dtype = dtype;
    ctx.seed = c.seed;
    ctx.device = device;
    MCC_ASSIGN_OR_RETURN(auto model, GPTModel::Create(c, ctx));
    const MicroBatch batch = To(Batch(c, 3, false), device);
    MCC_ASSIGN_OR_RETURN(Tensor whole, model->LastTokenLogits(batch.tokens));
    logits[d].push_back(whole);
  }
  for (size_t i = 0; i < logits[0].size(); ++i) {
    if (logits[1][i].device() != Device::TestDevice()) {
      return absl::InternalError("logits left the device");
    }
    MCC_ASSIGN_OR_RETURN(Tensor back, logits[1][i].To(Device::CPU()));
    const Tensor& want = logits[0][i];
    if (back.shape() != want.shape() ||
        std::memcmp(back.raw_data(), want.raw_data(), want.nbytes()) != 0) {
      return absl::InternalError(
          absl::StrCat("logits ", i, " differ between the CPU and the device"));
    }
  }
  return absl::OkStatus();
}

TEST(GPTDeviceTest, LastTokenLogitsMatchTheCpu) {
  for (auto [name, config] : Configs()) {
    config.seq_length = 4;
    config.max_position_embeddings = 8;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat(name, " ", DTypeName(dtype)));
      const absl::Status s =
          SameLastTokenLogits(config, dtype, nullptr, nullptr);
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

TEST(GPTDeviceTest, ABatchOnAnotherDeviceIsNamed) {
  GPTConfig c = Configs()[0].second;
  parallel::LayerContext ctx;
  ctx.device = Device::TestDevice();
  auto model = *GPTModel::Create(c, ctx);
  const auto r = model->ForwardBackward(Batch(c, 1, false), 1.0f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is not on the model's device testdev:0"),
            std::string::npos)
      << r.status();
}

// Tensor + sequence parallelism: each rank runs the model on the CPU (the
// world's gloo group) and on the test device (a gloo group that moves
// test-device tensors), and checks the runs agree bit for bit; then the
// KV-cache decoding over TP without SP.
MCC_WORKER(gpt_device_tp) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(120);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    std::fprintf(stderr, "init: %s\n", world.status().ToString().c_str());
    return 3;
  }
  comm::GroupOptions dev_options = options;
  dev_options.device = Device::TestDevice();
  std::vector<int> ranks(world->group->size());
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
  auto dev_group = world->group->NewSubgroup(ranks, &dev_options);
  if (!dev_group.ok()) {
    std::fprintf(stderr, "subgroup: %s\n",
                 dev_group.status().ToString().c_str());
    return 3;
  }
  for (const auto& [name, config] : Configs()) {
    for (DType dtype : kDTypes) {
      const std::string what = absl::StrCat(name, " ", DTypeName(dtype));
      auto cpu = Train(config, dtype, Device::CPU(), world->group.get(), true);
      auto dev =
          Train(config, dtype, Device::TestDevice(), dev_group->get(), true);
      absl::Status s = !cpu.ok()   ? cpu.status()
                       : !dev.ok() ? dev.status()
                                   : SameBits(*cpu, *dev);
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
        return 4;
      }
    }
    GPTConfig logits = config;
    logits.seq_length = 4;
    logits.max_position_embeddings = 8;
    const absl::Status s = SameLastTokenLogits(
        logits, DType::kFloat32, world->group.get(), dev_group->get());
    if (!s.ok()) {
      std::fprintf(stderr, "%s last-token logits: %s\n", name.c_str(),
                   s.ToString().c_str());
      return 5;
    }
  }
  return 0;
}

TEST(GPTDeviceTest, TensorAndSequenceParallelTrainsAsOnTheCpu) {
  auto results =
      comm::testing::RunWorkers(2, "gpt_device_tp", absl::Seconds(240));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
