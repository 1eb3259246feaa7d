// A quantised checkpoint (convert_checkpoint --quantize int8) loads into
// exactly the int8 weights that quantising the source checkpoint at load
// gives, bit for bit, serially and under TP 2 (real processes); dense runs
// refuse it; and --quantize values other than int8 are refused.
#include "inference/checkpoint_weights.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_writer.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/int8_quantization.h"
#include "models/gpt/model_config_proto.h"
#include "training/checkpointing.h"

namespace mcc {
namespace inference {
namespace {

gpt::GPTConfig Config(bool swiglu) {
  gpt::GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 100;
  c.seq_length = 8;
  c.make_vocab_size_divisible_by = 16;
  if (swiglu) {
    c.activation = gpt::Activation::kSwiGLU;
    c.position_embedding = gpt::PositionEmbedding::kRope;
    c.normalization = gpt::Normalization::kRMSNorm;
    c.add_bias_linear = false;
  }
  return c;
}

std::unique_ptr<gpt::GPTModel> Model(bool swiglu, uint64_t seed,
                                     comm::ProcessGroup* tp = nullptr) {
  parallel::LayerContext ctx;
  ctx.seed = seed;
  ctx.tp_group = tp;
  gpt::GPTConfig c = Config(swiglu);
  c.seed = seed;
  return *gpt::GPTModel::Create(c, ctx);
}

std::string Dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
}

// A dense checkpoint of a serial model with seed 7.
std::string SaveDense(bool swiglu) {
  const std::string dir = Dir(swiglu ? "dense_swiglu" : "dense_gelu");
  auto model = Model(swiglu, 7);
  std::vector<ShardedTensorRef> refs;
  for (const auto& p : model->parameters()) {
    refs.push_back(*training::ParameterRef(p->name, *p, p->value));
  }
  checkpoint::CommonState common;
  *common.mutable_model() = ToProto(Config(swiglu), DType::kFloat32);
  EXPECT_TRUE(
      SaveCheckpoint(dir, 3, refs, common, {}, DistContext::Single()).ok());
  return dir;
}

std::string Quantise(const std::string& dense) {
  const std::string out = dense + "_int8";
  auto reader = *CheckpointReader::Open(dense);
  const absl::Status s = gpt::WriteInt8Checkpoint(*reader, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

Tensor Tokens() {
  std::vector<int64_t> ids;
  for (int i = 0; i < 2 * 8; ++i) ids.push_back((i * 31 + 5) % 100);
  return *Tensor::FromInts(ids, {2, 8});
}

std::vector<uint8_t> Bytes(const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  std::memcpy(b.data(), t.raw_data(), b.size());
  return b;
}

void ExpectLoadEqualsQuantiseAtLoad(bool swiglu) {
  const std::string dense = SaveDense(swiglu);
  const std::string int8 = Quantise(dense);
  auto at_load = Model(swiglu, 1);  // Other seeds: loading must set all.
  auto from_ckpt = Model(swiglu, 2);
  auto r1 = *CheckpointReader::Open(dense);
  auto r2 = *CheckpointReader::Open(int8);
  EXPECT_FALSE(gpt::IsInt8Checkpoint(*r1));
  EXPECT_TRUE(gpt::IsInt8Checkpoint(*r2));
  ASSERT_TRUE(LoadCheckpointWeights(*r1, {at_load.get()}, "int8", true).ok());
  // A quantised checkpoint loads as int8 without --quantize.
  ASSERT_TRUE(LoadCheckpointWeights(*r2, {from_ckpt.get()}, "", true).ok());
  const ParameterList a = gpt::Int8CheckpointParameters(at_load.get());
  const ParameterList b = gpt::Int8CheckpointParameters(from_ckpt.get());
  ASSERT_EQ(a.size(), b.size());
  int int8_tensors = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]->name, b[i]->name);
    EXPECT_EQ(a[i]->value.dtype(), b[i]->value.dtype()) << a[i]->name;
    EXPECT_EQ(Bytes(a[i]->value), Bytes(b[i]->value)) << a[i]->name;
    int8_tensors += a[i]->value.dtype() == DType::kInt8;
  }
  EXPECT_EQ(int8_tensors, 2 * 4);
  auto la = at_load->LastTokenLogits(Tokens());
  auto lb = from_ckpt->LastTokenLogits(Tokens());
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(Bytes(*la), Bytes(*lb));
  // The stored scales have the weights' row shapes.
  auto scale = *r2->FindTensor("decoder.layers.0.mlp.linear_fc1.weight_scale");
  EXPECT_EQ(scale->dtype(), checkpoint::DTYPE_FLOAT32);
  EXPECT_EQ(scale->global_shape_size(), swiglu ? 2 : 1);
}

TEST(Int8CheckpointTest, LoadingEqualsQuantisingAtLoadBitForBit) {
  ExpectLoadEqualsQuantiseAtLoad(/*swiglu=*/false);
}

TEST(Int8CheckpointTest, SwigluLoadingEqualsQuantisingAtLoadBitForBit) {
  ExpectLoadEqualsQuantiseAtLoad(/*swiglu=*/true);
}

TEST(Int8CheckpointTest, RefusalsNameTheProblem) {
  const std::string int8 = Quantise(SaveDense(false));
  auto reader = *CheckpointReader::Open(int8);
  // A dense run (train) must not read int8 values as weights.
  auto dense = Model(false, 1);
  absl::Status s = training::LoadParameters(*reader, dense->parameters());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is int8"), std::string::npos) << s;
  s = gpt::WriteInt8Checkpoint(*reader, Dir("twice"));
  EXPECT_NE(s.message().find("already quantised"), std::string::npos) << s;
  s = LoadCheckpointWeights(*reader, {dense.get()}, "int4", false);
  EXPECT_NE(s.message().find("--quantize must be int8"), std::string::npos)
      << s;
}

std::string TpLogitsPath() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/int8_ckpt_tp2.txt");
}

MCC_WORKER(int8_ckpt_tp) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  auto model = Model(false, 1, world->group.get());
  auto reader = CheckpointReader::Open(Dir("dense_gelu_int8"));
  if (!reader.ok()) return 4;
  absl::Status s = LoadCheckpointWeights(**reader, {model.get()}, "", false);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 5;
  }
  auto logits = model->LastTokenLogits(Tokens());
  if (!logits.ok()) return 6;
  if (world->group->rank() == 0) {
    FILE* f = std::fopen(TpLogitsPath().c_str(), "w");
    for (float v : logits->ToFloats()) std::fprintf(f, "%.9g\n", v);
    std::fclose(f);
  }
  return 0;
}

// The quantised checkpoint (written serially) loads at TP 2 and computes
// the serial quantised model's logits to fp32 reduction order.
TEST(Int8CheckpointTest, LoadsUnderTensorParallelism) {
  const std::string int8 = Quantise(SaveDense(false));
  auto results =
      comm::testing::RunWorkers(2, "int8_ckpt_tp", absl::Seconds(120));
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  auto serial = Model(false, 1);
  auto reader = *CheckpointReader::Open(int8);
  ASSERT_TRUE(LoadCheckpointWeights(*reader, {serial.get()}, "", false).ok());
  const std::vector<float> want = serial->LastTokenLogits(Tokens())->ToFloats();
  FILE* f = std::fopen(TpLogitsPath().c_str(), "r");
  ASSERT_NE(f, nullptr);
  double diff = 0, ref = 0;
  for (float w : want) {
    float v;
    ASSERT_EQ(std::fscanf(f, "%f", &v), 1);
    diff = std::max(diff, std::abs(static_cast<double>(v) - w));
    ref = std::max(ref, std::abs(static_cast<double>(w)));
  }
  std::fclose(f);
  EXPECT_LE(diff / ref, 1e-5);
}

}  // namespace
}  // namespace inference
}  // namespace mcc
