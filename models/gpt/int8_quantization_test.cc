// Weight-only int8 inference of a GPT chunk: the quantised model computes
// what the dense model with the dequantised weights (s * q) computes, the
// int8 weights are the ops' per-channel quantisation of the loaded ones, and
// tensor parallelism (TP 2, real processes) quantises exactly as the serial
// model does.
#include "models/gpt/int8_quantization.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/ops/int8_quantize.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"

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
  c.seed = 5;
  return c;
}

GPTConfig SwigluConfig() {
  GPTConfig c = TinyConfig();
  c.position_embedding = PositionEmbedding::kRope;
  c.normalization = Normalization::kRMSNorm;
  c.activation = Activation::kSwiGLU;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

absl::StatusOr<std::unique_ptr<GPTModel>> Build(const GPTConfig& config,
                                                comm::ProcessGroup* tp) {
  parallel::LayerContext ctx;
  ctx.tp_group = tp;
  ctx.seed = config.seed;
  return GPTModel::Create(config, ctx);
}

Tensor Tokens() {
  std::vector<int64_t> ids;
  for (int i = 0; i < 2 * 12; ++i) ids.push_back((i * 37 + 11) % 128);
  return *Tensor::FromInts(ids, {2, 12});
}

double MaxRelativeError(const std::vector<float>& a,
                        const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return diff / ref;
}

// Every quantised linear of `model`, with the dense one of `dense` at the
// same place.
template <typename Fn>
void ForEachLinearPair(GPTModel* model, GPTModel* dense, Fn fn) {
  for (int i = 0; i < model->num_local_layers(); ++i) {
    fn(*model->layer(i)->qkv()->int8_weight(),
       dense->layer(i)->qkv()->weight().get());
    fn(*model->layer(i)->proj()->int8_weight(),
       dense->layer(i)->proj()->weight().get());
    fn(*model->layer(i)->fc1()->int8_weight(),
       dense->layer(i)->fc1()->weight().get());
    fn(*model->layer(i)->fc2()->int8_weight(),
       dense->layer(i)->fc2()->weight().get());
  }
}

void Check(const GPTConfig& config) {
  auto model = Build(config, nullptr);
  auto dense = Build(config, nullptr);
  ASSERT_TRUE(model.ok() && dense.ok());
  auto before = (*model)->LastTokenLogits(Tokens());
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(QuantizeLinearWeightsInt8(model->get()).ok());

  // q and s are the ops' quantisation of the dense weight (rows = every
  // dimension but the last), and the dense twin gets s * q.
  ForEachLinearPair(
      model->get(), dense->get(),
      [](const parallel::Int8Weight& w8, Parameter* w) {
        const int64_t cols = w->value.shape().back();
        Tensor matrix = *w->value.Reshape({-1, cols});
        Tensor absmax = Tensor::Empty({matrix.size(0)}, DType::kFloat32);
        ASSERT_TRUE(ops::RowAbsMax(matrix, &absmax).ok());
        Tensor q = Tensor::Empty(matrix.shape(), DType::kInt8);
        Tensor s = Tensor::Empty({matrix.size(0)}, DType::kFloat32);
        ASSERT_TRUE(ops::QuantizeRowsInt8(matrix, absmax, &q, &s).ok());
        EXPECT_EQ(q.ToDoubles(), w8.q->value.ToDoubles()) << w->name;
        EXPECT_EQ(s.ToFloats(), w8.scales->value.ToFloats()) << w->name;
        EXPECT_EQ(w8.q->name, w->name);
        EXPECT_EQ(w8.scales->name, Int8ScaleName(w->name));
        EXPECT_TRUE(IsInt8QuantizedWeightName(w->name)) << w->name;
        const std::vector<double> qv = q.ToDoubles();
        const std::vector<float> sv = s.ToFloats();
        float* out = w->value.data<float>();
        for (size_t i = 0; i < qv.size(); ++i) {
          out[i] = sv[i / cols] * static_cast<float>(qv[i]);
        }
      });
  for (int i = 0; i < (*model)->num_local_layers(); ++i) {
    EXPECT_FALSE((*model)->layer(i)->qkv()->weight()->value.defined())
        << "the dense weight is released";
  }

  auto int8 = (*model)->LastTokenLogits(Tokens());
  auto dequantised = (*dense)->LastTokenLogits(Tokens());
  ASSERT_TRUE(int8.ok()) << int8.status();
  ASSERT_TRUE(dequantised.ok()) << dequantised.status();
  // Only fp32 rounding apart: the GEMMs' summation orders and the rounding
  // of s * q (2^-24 relative each), through two layers.
  EXPECT_LE(MaxRelativeError(int8->ToFloats(), dequantised->ToFloats()), 1e-5);
  // Quantisation itself moves the logits by more than that (so the check
  // above would see a model that skipped the int8 weights).
  const double moved = MaxRelativeError(int8->ToFloats(), before->ToFloats());
  EXPECT_GT(moved, 1e-5);
  EXPECT_LT(moved, 5e-2);

  // Inference only.
  MicroBatch batch{Tokens(), Tokens(), Tensor()};
  auto trained = (*model)->ForwardBackward(batch, 1.0f);
  ASSERT_FALSE(trained.ok());
  EXPECT_NE(trained.status().message().find("int8"), std::string::npos)
      << trained.status();
  EXPECT_FALSE(QuantizeLinearWeightsInt8(model->get()).ok())
      << "quantising twice is refused";
}

TEST(Int8QuantizationTest, QuantisedModelComputesTheDequantisedModel) {
  Check(TinyConfig());
}

TEST(Int8QuantizationTest, SwigluStackedFc1) { Check(SwigluConfig()); }

TEST(Int8QuantizationTest, CheckpointParametersReplaceEachQuantisedWeight) {
  auto model = Build(SwigluConfig(), nullptr);
  ASSERT_TRUE(model.ok());
  const size_t dense_count = (*model)->parameters().size();
  ASSERT_TRUE(PrepareInt8Weights(model->get()).ok());
  const ParameterList params = Int8CheckpointParameters(model->get());
  // 4 quantised weights per layer, each now two tensors.
  EXPECT_EQ(params.size(), dense_count + 4 * 2);
  bool saw_fc1 = false;
  for (const auto& p : params) {
    if (p->name == "decoder.layers.1.mlp.linear_fc1.weight") {
      saw_fc1 = true;
      EXPECT_EQ(p->value.dtype(), DType::kInt8);
      EXPECT_EQ(p->global_shape, (Shape{2, 256, 64}));
    }
    if (p->name == "decoder.layers.1.mlp.linear_fc1.weight_scale") {
      EXPECT_EQ(p->value.dtype(), DType::kFloat32);
      EXPECT_EQ(p->global_shape, (Shape{2, 256}));
    }
    EXPECT_TRUE(p->value.defined()) << p->name;
  }
  EXPECT_TRUE(saw_fc1);
  const Int8WeightBytes bytes = CountInt8WeightBytes(model->get());
  // Per layer: qkv 192x64, proj 64x64, fc1 512x64, fc2 64x256.
  const int64_t elems = 2 * (192 * 64 + 64 * 64 + 512 * 64 + 64 * 256);
  const int64_t rows = 2 * (192 + 64 + 512 + 64);
  EXPECT_EQ(bytes.int8_bytes, elems + 4 * rows);
  EXPECT_EQ(bytes.dense_bytes, 4 * elems);
  EXPECT_FALSE(IsInt8QuantizedWeightName("embedding.word_embeddings.weight"));
  EXPECT_FALSE(IsInt8QuantizedWeightName("output_layer.weight"));
  EXPECT_FALSE(IsInt8QuantizedWeightName(
      "optimizer.exp_avg.decoder.layers.0.mlp.linear_fc1.weight"));
}

std::string LogitsPath() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/int8_tp2_logits.txt");
}

MCC_WORKER(int8_tp) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  auto model = Build(TinyConfig(), world->group.get());
  if (!model.ok()) return 4;
  if (!QuantizeLinearWeightsInt8(model->get()).ok()) return 5;
  auto logits = (*model)->LastTokenLogits(Tokens());
  if (!logits.ok()) return 6;
  if (world->group->rank() == 0) {
    FILE* f = std::fopen(LogitsPath().c_str(), "w");
    for (float v : logits->ToFloats()) std::fprintf(f, "%.9g\n", v);
    std::fclose(f);
  }
  return 0;
}

// The row-parallel layers' row maxima are all-reduced: TP 2 gets the serial
// int8 weights, so its logits equal the serial quantised model's to fp32
// reduction order. Per-shard maxima would move them by the quantisation
// error (the serial model's `moved` above, well over 1e-5).
TEST(Int8QuantizationTest, TensorParallelQuantisesAsSerial) {
  auto results = comm::testing::RunWorkers(2, "int8_tp", absl::Seconds(120));
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  auto serial = Build(TinyConfig(), nullptr);
  ASSERT_TRUE(serial.ok());
  ASSERT_TRUE(QuantizeLinearWeightsInt8(serial->get()).ok());
  auto want = (*serial)->LastTokenLogits(Tokens());
  ASSERT_TRUE(want.ok());
  std::vector<float> got(want->numel());
  FILE* f = std::fopen(LogitsPath().c_str(), "r");
  ASSERT_NE(f, nullptr);
  for (float& v : got) ASSERT_EQ(std::fscanf(f, "%f", &v), 1);
  std::fclose(f);
  EXPECT_LE(MaxRelativeError(got, want->ToFloats()), 1e-5);
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
