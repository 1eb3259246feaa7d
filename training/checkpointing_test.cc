// Checkpoints hold the vocabulary without the TP padding, and load under any
// padding; checkpoints written before the padding left the model (their
// vocabulary tensors hold the padded rows) still load, and a vocabulary
// tensor that is neither is refused naming the checkpoint.
#include "training/checkpointing.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_writer.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/model_config_proto.h"

namespace mcc {
namespace training {
namespace {

constexpr char kEmbedding[] = "embedding.word_embeddings.weight";

gpt::GPTConfig Tiny(int64_t multiple) {
  gpt::GPTConfig c;
  c.num_layers = 1;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.vocab_size = 100;
  c.seq_length = 4;
  c.untie_embeddings_and_output_weights = true;
  c.make_vocab_size_divisible_by = multiple;
  return c;
}

std::unique_ptr<gpt::GPTModel> Model(int64_t multiple) {
  parallel::LayerContext ctx;
  return *gpt::GPTModel::Create(Tiny(multiple), ctx);
}

std::string Dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
}

const Parameter& Find(const gpt::GPTModel& m, const std::string& name) {
  for (const auto& p : m.parameters()) {
    if (p->name == name) return *p;
  }
  ADD_FAILURE() << name;
  return *m.parameters()[0];
}

// Rows [0, rows) of dimension 0.
std::vector<float> Rows(const Tensor& t, int64_t rows) {
  std::vector<float> v = t.ToFloats();
  v.resize(rows * (t.numel() / t.size(0)));
  return v;
}

TEST(TrainingCheckpointTest, VocabularyLoadsUnderAnyPadding) {
  auto saved = Model(8);  // 104 rows.
  for (const auto& p : saved->parameters()) {
    // Distinct values everywhere but the padding.
    std::vector<float> v = p->value.ToFloats();
    for (size_t i = 0; i < v.size(); ++i) v[i] += 0.001f * (i % 97);
    ASSERT_TRUE(
        p->value.CopyFrom(*Tensor::FromVector(v, p->value.shape())).ok());
    if (p->unpadded_rows >= 0) {
      (*p->value.Slice(p->unpadded_rows, p->value.size(0))).Zero();
    }
  }
  std::vector<ShardedTensorRef> refs;
  for (const auto& p : saved->parameters()) {
    auto ref = ParameterRef(p->name, *p, p->value);
    ASSERT_TRUE(ref.has_value());
    if (p->unpadded_rows >= 0) {
      EXPECT_EQ(ref->global_shape, (Shape{100, 8})) << p->name;
    }
    refs.push_back(*ref);
  }
  checkpoint::CommonState common;
  *common.mutable_model() = ToProto(Tiny(8), DType::kFloat32);
  const std::string dir = Dir("any_padding");
  ASSERT_TRUE(
      SaveCheckpoint(dir, 1, refs, common, {}, DistContext::Single()).ok());
  auto reader = *CheckpointReader::Open(dir);
  EXPECT_EQ(reader->common_state().model().vocab_size(), 100);
  EXPECT_EQ((*reader->FindTensor(kEmbedding))->global_shape(0), 100);
  auto loaded = Model(64);  // 128 rows.
  ASSERT_TRUE(LoadParameters(*reader, loaded->parameters()).ok());
  for (const auto& p : saved->parameters()) {
    const Parameter& q = Find(*loaded, p->name);
    EXPECT_EQ(Rows(q.value, p->model_rows()), Rows(p->value, p->model_rows()))
        << p->name;
    const std::vector<float> all = q.value.ToFloats();
    for (size_t i = p->model_rows() * q.value.numel() / q.value.size(0);
         i < all.size(); ++i) {
      ASSERT_EQ(all[i], 0.0f) << p->name << " padding element " << i;
    }
  }
}

TEST(TrainingCheckpointTest, CheckpointsWithPaddedRowsLoadWithoutThem) {
  auto model = Model(8);
  // As written before: the vocabulary tensors with 128 padded rows (the
  // last 28 trained, so not zero), recorded as padded_vocab_size.
  std::vector<ShardedTensorRef> refs;
  std::vector<Tensor> stored;
  for (const auto& p : model->parameters()) {
    Shape shape = p->global_shape;
    if (p->unpadded_rows >= 0) shape[0] = 128;
    std::vector<float> v(NumElements(shape));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f + 0.001f * (i % 89);
    stored.push_back(*Tensor::FromVector(v, shape));
    refs.push_back(ShardedTensorRef::Replicated(p->name, stored.back()));
  }
  checkpoint::CommonState common;
  *common.mutable_model() = ToProto(Tiny(8), DType::kFloat32);
  common.mutable_model()->set_padded_vocab_size(128);
  const std::string dir = Dir("legacy");
  ASSERT_TRUE(
      SaveCheckpoint(dir, 2, refs, common, {}, DistContext::Single()).ok());
  auto reader = *CheckpointReader::Open(dir);
  ASSERT_TRUE(reader->CheckModelConfig(ToProto(Tiny(8), DType::kFloat32)).ok());
  ASSERT_TRUE(LoadParameters(*reader, model->parameters()).ok());
  for (size_t i = 0; i < stored.size(); ++i) {
    const Parameter& p = *model->parameters()[i];
    EXPECT_EQ(Rows(p.value, p.model_rows()), Rows(stored[i], p.model_rows()))
        << p.name;
    if (p.unpadded_rows >= 0) {
      const std::vector<float> all = p.value.ToFloats();
      for (size_t j = 100 * 8; j < all.size(); ++j) ASSERT_EQ(all[j], 0.0f);
    }
  }

  // Rows that are not the recorded padding: refused, naming the file.
  common.mutable_model()->set_padded_vocab_size(120);
  const std::string bad = Dir("legacy_bad");
  ASSERT_TRUE(
      SaveCheckpoint(bad, 2, refs, common, {}, DistContext::Single()).ok());
  auto bad_reader = *CheckpointReader::Open(bad);
  absl::Status s = LoadParameters(*bad_reader, model->parameters());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(bad + "/iter_0000002"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[128, 8]"), std::string::npos) << s;
}

}  // namespace
}  // namespace training
}  // namespace mcc
