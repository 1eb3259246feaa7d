// Weight-only FP8 inference of a GPT chunk (--quantize fp8): the quantised
// model computes what the dense model with the dequantised weights
// (e4m3(code) / s) computes, per channel and per tensor; the codes take half
// of bf16's bytes; tensor parallelism (TP 2, real processes) quantises as
// the serial model does.
#include "models/gpt/fp8_quantization.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/fp8.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"

namespace mcc {
namespace gpt {
namespace {

using ops::Fp8WeightScaling;

GPTConfig Config(bool swiglu) {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 128;
  c.seq_length = 16;
  c.seed = 5;
  if (swiglu) {
    c.position_embedding = PositionEmbedding::kRope;
    c.normalization = Normalization::kRMSNorm;
    c.activation = Activation::kSwiGLU;
    c.add_bias_linear = false;
    c.untie_embeddings_and_output_weights = true;
  }
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

// Writes e4m3(code) / s into the dense twin's weight.
void Dequantise(const parallel::Fp8Weight& w8, Parameter* w) {
  const int64_t cols = w->value.shape().back();
  const std::vector<double> codes = w8.q->value.ToDoubles();
  const std::vector<float> s = w8.scales->value.ToFloats();
  float* out = w->value.data<float>();
  for (size_t i = 0; i < codes.size(); ++i) {
    const uint8_t code = static_cast<uint8_t>(static_cast<int8_t>(codes[i]));
    out[i] = Fp8ToFloat(code, Fp8Format::kE4M3) / s[i / cols];
  }
}

class Fp8QuantizationTest
    : public ::testing::TestWithParam<std::tuple<Fp8WeightScaling, bool>> {};

TEST_P(Fp8QuantizationTest, QuantisedModelComputesTheDequantisedModel) {
  const auto [scaling, swiglu] = GetParam();
  const GPTConfig config = Config(swiglu);
  auto model = Build(config, nullptr);
  auto dense = Build(config, nullptr);
  ASSERT_TRUE(model.ok() && dense.ok());
  auto before = (*model)->LastTokenLogits(Tokens());
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(QuantizeLinearWeightsFp8(model->get(), scaling).ok());
  for (int i = 0; i < (*model)->num_local_layers(); ++i) {
    TransformerLayer* q = (*model)->layer(i);
    TransformerLayer* d = (*dense)->layer(i);
    Dequantise(*q->qkv_fp8(), d->qkv()->weight().get());
    Dequantise(*q->proj_fp8(), d->proj()->weight().get());
    Dequantise(*q->fc1_fp8(), d->fc1()->weight().get());
    Dequantise(*q->fc2_fp8(), d->fc2()->weight().get());
    EXPECT_FALSE(q->qkv()->weight()->value.defined());
    // Per tensor: one scale in every row.
    const std::vector<float> s = q->fc2_fp8()->scales->value.ToFloats();
    const bool uniform =
        std::all_of(s.begin(), s.end(), [&](float v) { return v == s[0]; });
    EXPECT_EQ(uniform, scaling == Fp8WeightScaling::kPerTensor);
  }
  auto fp8 = (*model)->LastTokenLogits(Tokens());
  auto dequantised = (*dense)->LastTokenLogits(Tokens());
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  ASSERT_TRUE(dequantised.ok()) << dequantised.status();
  EXPECT_LE(MaxRelativeError(fp8->ToFloats(), dequantised->ToFloats()), 1e-5);
  const double moved = MaxRelativeError(fp8->ToFloats(), before->ToFloats());
  std::printf(
      "%s%s: logits move by %.2e (max relative) from the dense "
      "model's\n",
      ops::Fp8WeightScalingName(scaling), swiglu ? " swiglu" : "", moved);
  EXPECT_GT(moved, 1e-5);
  EXPECT_LT(moved, 0.1);
  // Half of bf16's bytes for the codes; the scales come on top.
  const Fp8WeightBytes bytes = CountFp8WeightBytes(model->get());
  EXPECT_GT(bytes.code_bytes, 0);
  EXPECT_EQ(2 * bytes.code_bytes, bytes.bf16_bytes);
  EXPECT_LT(bytes.scale_bytes, bytes.code_bytes / 8);
  MicroBatch batch{Tokens(), Tokens(), Tensor()};
  auto trained = (*model)->ForwardBackward(batch, 1.0f);
  ASSERT_FALSE(trained.ok());
  EXPECT_NE(trained.status().message().find("FP8"), std::string::npos)
      << trained.status();
  EXPECT_FALSE(QuantizeLinearWeightsFp8(model->get(), scaling).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Fp8QuantizationTest,
    ::testing::Combine(::testing::Values(Fp8WeightScaling::kPerChannel,
                                         Fp8WeightScaling::kPerTensor),
                       ::testing::Bool()));

std::string LogitsPath(Fp8WeightScaling scaling) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/fp8_tp2_logits_",
                      static_cast<int>(scaling), ".txt");
}

MCC_WORKER(fp8_tp) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  for (const auto scaling :
       {Fp8WeightScaling::kPerChannel, Fp8WeightScaling::kPerTensor}) {
    auto model = Build(Config(true), world->group.get());
    if (!model.ok()) return 4;
    const absl::Status s = QuantizeLinearWeightsFp8(model->get(), scaling);
    if (!s.ok()) return comm::testing::ReportFailure("quantize", s, 5);
    auto logits = (*model)->LastTokenLogits(Tokens());
    if (!logits.ok()) return 6;
    if (world->group->rank() == 0) {
      FILE* f = std::fopen(LogitsPath(scaling).c_str(), "w");
      for (float v : logits->ToFloats()) std::fprintf(f, "%.9g\n", v);
      std::fclose(f);
    }
  }
  return 0;
}

// Row-parallel row maxima and per-tensor maxima are all-reduced over TP, so
// TP 2 gets the serial codes and scales: logits equal to fp32 reduction
// order.
TEST(Fp8QuantizationTpTest, TensorParallelQuantisesAsSerial) {
  auto results = comm::testing::RunWorkers(2, "fp8_tp", absl::Seconds(120));
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  for (const auto scaling :
       {Fp8WeightScaling::kPerChannel, Fp8WeightScaling::kPerTensor}) {
    SCOPED_TRACE(ops::Fp8WeightScalingName(scaling));
    auto serial = Build(Config(true), nullptr);
    ASSERT_TRUE(serial.ok());
    ASSERT_TRUE(QuantizeLinearWeightsFp8(serial->get(), scaling).ok());
    auto want = (*serial)->LastTokenLogits(Tokens());
    ASSERT_TRUE(want.ok());
    std::vector<float> got(want->numel());
    FILE* f = std::fopen(LogitsPath(scaling).c_str(), "r");
    ASSERT_NE(f, nullptr);
    for (float& v : got) ASSERT_EQ(std::fscanf(f, "%f", &v), 1);
    std::fclose(f);
    EXPECT_LE(MaxRelativeError(got, want->ToFloats()), 1e-5);
  }
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
