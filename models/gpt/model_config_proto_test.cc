// A stored model config is checked against what its checkpoint's files can
// hold before the model it describes is allocated.
#include "models/gpt/model_config_proto.h"

#include <string>

#include "gtest/gtest.h"

namespace mcc {
namespace gpt {
namespace {

gpt::GPTConfig Small() {
  gpt::GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 256;
  return c;  // FFN 128: 256 x 32 + 2 x (2 x 32^2 + 2 x 32 x 128) = 28,672.
}

TEST(CheckConfigFitsCheckpointTest, AConfigItsFilesCanHoldPasses) {
  EXPECT_TRUE(CheckConfigFitsCheckpoint(Small(), 28672, "ckpt").ok());
  // A real checkpoint holds fp32 or bf16 weights and more tensors besides.
  EXPECT_TRUE(CheckConfigFitsCheckpoint(Small(), 4 * 40000, "ckpt").ok());
}

TEST(CheckConfigFitsCheckpointTest, MoreParametersThanTheFilesHoldAreRefused) {
  absl::Status s = CheckConfigFitsCheckpoint(Small(), 28671, "ckpt/iter_1");
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("ckpt/iter_1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("hidden 32"), std::string::npos) << s;
  // What a hostile metadata.pb asks for: 2^31 hidden, 2^31 layers.
  gpt::GPTConfig huge = Small();
  huge.hidden_size = int64_t{1} << 31;
  huge.num_layers = (1 << 30) * 2 - 1;
  EXPECT_FALSE(CheckConfigFitsCheckpoint(huge, int64_t{1} << 40, "c").ok());
}

TEST(CheckConfigFitsCheckpointTest, SizesMustBePositive) {
  for (int field = 0; field < 4; ++field) {
    gpt::GPTConfig c = Small();
    if (field == 0) c.num_layers = 0;
    if (field == 1) c.hidden_size = -32;
    if (field == 2) c.num_attention_heads = 0;
    if (field == 3) c.vocab_size = -1;
    absl::Status s = CheckConfigFitsCheckpoint(c, int64_t{1} << 40, "c");
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << field;
    EXPECT_NE(s.message().find("must be positive"), std::string::npos) << s;
  }
}

TEST(ModelConfigProtoTest, Llama3RopeScalingRoundTrips) {
  gpt::GPTConfig c = Small();
  c.position_embedding = PositionEmbedding::kRope;
  EXPECT_FALSE(ToProto(c, DType::kFloat32).has_rope_scaling());
  EXPECT_FALSE(FromProto(ToProto(c, DType::kFloat32))->rope_scaling.enabled);
  c.rope_scaling.enabled = true;
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.low_freq_factor = 2.0;
  c.rope_scaling.high_freq_factor = 8.0;
  c.rope_scaling.original_max_position_embeddings = 4096;
  const checkpoint::ModelConfig p = ToProto(c, DType::kFloat32);
  EXPECT_EQ(p.rope_scaling().rope_type(), "llama3");
  absl::StatusOr<gpt::GPTConfig> back = FromProto(p);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->rope_scaling == c.rope_scaling);
}

TEST(ModelConfigProtoTest, SlidingWindowRoundTrips) {
  gpt::GPTConfig c = Small();
  EXPECT_EQ(ToProto(c, DType::kFloat32).sliding_window(), 0);
  EXPECT_EQ(FromProto(ToProto(c, DType::kFloat32))->window_left, -1);
  c.window_left = 3;  // --window-size 3,0: four keys, Hugging Face's 4.
  const checkpoint::ModelConfig p = ToProto(c, DType::kFloat32);
  EXPECT_EQ(p.sliding_window(), 4);
  EXPECT_EQ(FromProto(p)->window_left, 3);
  checkpoint::ModelConfig bad = p;
  bad.set_sliding_window(-2);
  EXPECT_FALSE(FromProto(bad).ok());
}

TEST(ModelConfigProtoTest, UnknownRopeScalingTypeIsRefusedByName) {
  checkpoint::ModelConfig p = ToProto(Small(), DType::kFloat32);
  p.mutable_rope_scaling()->set_rope_type("yarn");
  absl::StatusOr<gpt::GPTConfig> c = FromProto(p);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'yarn'"), std::string::npos)
      << c.status();
  p.mutable_rope_scaling()->set_rope_type("llama3");
  p.mutable_rope_scaling()->set_factor(0.0);
  EXPECT_FALSE(FromProto(p).ok());
}

TEST(ModelConfigProtoTest, MoeRoundTripsAndDenseLeavesItUnset) {
  EXPECT_EQ(ToProto(Small(), DType::kFloat32).num_experts(), 0);
  EXPECT_EQ(ToProto(Small(), DType::kFloat32).moe_layer_pattern(), "");
  gpt::GPTConfig c = Small();
  c.add_bias_linear = false;
  c.num_experts = 8;
  c.moe_router_topk = 3;
  c.moe_ffn_hidden_size = 24;
  c.moe_layer_freq = "2";
  c.moe_shared_expert_intermediate_size = 40;
  c.moe_router_score_function = ops::MoeScoreFunction::kSigmoid;
  c.moe_router_enable_expert_bias = true;
  const checkpoint::ModelConfig p = ToProto(c, DType::kFloat32);
  EXPECT_EQ(p.moe_layer_pattern(), "[1,0]");
  EXPECT_EQ(p.moe_router_score_function(), "sigmoid");
  absl::StatusOr<gpt::GPTConfig> back = FromProto(p);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->num_experts, 8);
  EXPECT_EQ(back->moe_router_topk, 3);
  EXPECT_EQ(back->moe_ffn(), 24);
  EXPECT_TRUE(back->IsMoeLayer(0));
  EXPECT_FALSE(back->IsMoeLayer(1));
  EXPECT_EQ(back->moe_shared_expert_intermediate_size, 40);
  EXPECT_EQ(back->moe_router_score_function, ops::MoeScoreFunction::kSigmoid);
  EXPECT_TRUE(back->moe_router_enable_expert_bias);
  // The same model under another spelling of the pattern stores the same.
  c.moe_layer_freq = "[1,0]";
  EXPECT_EQ(ToProto(c, DType::kFloat32).moe_layer_pattern(), "[1,0]");
  checkpoint::ModelConfig bad = p;
  bad.set_moe_router_score_function("tanh");
  EXPECT_FALSE(FromProto(bad).ok());
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
