#include "parallel/pipeline/layer_split.h"

#include "gtest/gtest.h"

namespace mcc {
namespace pipeline {
namespace {

std::vector<int> Counts(const PipelineConfig& c) {
  std::vector<int> counts;
  int next = 0;
  for (int s = 0; s < c.pipeline_size; ++s) {
    auto r = StageLayers(c, s);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->size(), 1u);
    EXPECT_EQ((*r)[0].first, next) << "stage " << s;
    next += (*r)[0].count;
    counts.push_back((*r)[0].count);
  }
  EXPECT_EQ(next, c.num_layers);
  return counts;
}

TEST(LayerSplitTest, EvenSplit) {
  PipelineConfig c;
  c.num_layers = 8;
  c.pipeline_size = 4;
  EXPECT_EQ(Counts(c), (std::vector<int>{2, 2, 2, 2}));
}

TEST(LayerSplitTest, ExplicitFirstAndLast) {
  PipelineConfig c;
  c.num_layers = 10;
  c.pipeline_size = 4;
  c.first_stage_layers = 1;
  c.last_stage_layers = 3;
  EXPECT_EQ(Counts(c), (std::vector<int>{1, 3, 3, 3}));
  c.last_stage_layers = 0;
  c.num_layers = 7;
  EXPECT_EQ(Counts(c), (std::vector<int>{1, 2, 2, 2}));
}

TEST(LayerSplitTest, InterleavedChunksTakeEveryPthRun) {
  PipelineConfig c;
  c.num_layers = 8;
  c.pipeline_size = 2;
  c.layers_per_virtual_stage = 2;
  EXPECT_EQ(c.virtual_stages(), 2);
  auto s0 = StageLayers(c, 0);
  auto s1 = StageLayers(c, 1);
  ASSERT_TRUE(s0.ok() && s1.ok());
  ASSERT_EQ(s0->size(), 2u);
  EXPECT_EQ((*s0)[0].first, 0);
  EXPECT_EQ((*s1)[0].first, 2);
  EXPECT_EQ((*s0)[1].first, 4);
  EXPECT_EQ((*s1)[1].first, 6);
}

TEST(LayerSplitTest, BadSplitsNameTheFlags) {
  PipelineConfig c;
  c.num_layers = 6;
  c.pipeline_size = 4;
  auto s = ValidatePipelineConfig(c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--num-layers 6 is not divisible by "
                             "--pipeline-model-parallel-size 4"),
            std::string::npos)
      << s;
  c.first_stage_layers = 2;  // Leaves 4 layers for 3 stages.
  s = ValidatePipelineConfig(c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--decoder-first-pipeline-num-layers"),
            std::string::npos)
      << s;
  c.first_stage_layers = 0;
  c.num_layers = 8;
  c.layers_per_virtual_stage = 3;
  s = ValidatePipelineConfig(c);
  EXPECT_NE(s.message().find("--num-layers-per-virtual-pipeline-stage"),
            std::string::npos)
      << s;
  c.num_layers = 2;
  c.layers_per_virtual_stage = 0;
  EXPECT_FALSE(ValidatePipelineConfig(c).ok());  // Fewer layers than stages.
}

TEST(LayerSplitTest, ZeroBubbleVHalvesAnUnevenSplit) {
  // The balanced split under ZB-V: each stage's count over its two chunks,
  // chunk 1 of stage p holding virtual stage 2P - 1 - p.
  PipelineConfig c;
  c.num_layers = 6;
  c.pipeline_size = 2;
  c.first_stage_layers = 2;
  c.v_shape = true;
  EXPECT_EQ(c.virtual_stages(), 2);
  auto s0 = StageLayers(c, 0);
  auto s1 = StageLayers(c, 1);
  ASSERT_TRUE(s0.ok() && s1.ok()) << s0.status() << s1.status();
  EXPECT_EQ((*s0)[0].first, 0);
  EXPECT_EQ((*s0)[0].count, 1);
  EXPECT_EQ((*s1)[0].first, 1);
  EXPECT_EQ((*s1)[0].count, 2);
  EXPECT_EQ((*s1)[1].first, 3);
  EXPECT_EQ((*s1)[1].count, 2);
  EXPECT_EQ((*s0)[1].first, 5);
  EXPECT_EQ((*s0)[1].count, 1);
  // PP 4: 2 | 4 | 4 | 2 layers; every layer in exactly one chunk.
  c.num_layers = 12;
  c.pipeline_size = 4;
  c.last_stage_layers = 2;
  std::vector<int> owner(12, -1);
  for (int p = 0; p < 4; ++p) {
    auto r = StageLayers(c, p);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->size(), 2u);
    EXPECT_EQ((*r)[0].count, p == 0 || p == 3 ? 1 : 2);
    for (const LayerRange& range : *r) {
      for (int l = range.first; l < range.first + range.count; ++l) {
        EXPECT_EQ(owner[l], -1) << "layer " << l;
        owner[l] = p;
      }
    }
  }
  EXPECT_EQ(owner, (std::vector<int>{0, 1, 1, 2, 2, 3, 3, 2, 2, 1, 1, 0}));
}

TEST(LayerSplitTest, UnevenSplitsWithVirtualStagesNameTheFlags) {
  PipelineConfig c;
  c.num_layers = 8;
  c.pipeline_size = 2;
  c.first_stage_layers = 2;
  c.layers_per_virtual_stage = 1;
  // Interleaved: refused (Megatron needs --num-virtual-stages-per-pipeline-
  // rank for it).
  auto s = ValidatePipelineConfig(c);
  EXPECT_NE(s.message().find("--num-layers-per-virtual-pipeline-stage (the "
                             "interleaved schedule) cannot be combined"),
            std::string::npos)
      << s;
  // ZB-V: the chunk size comes from the split, not the flag.
  c.v_shape = true;
  c.layers_per_virtual_stage = 2;
  s = ValidatePipelineConfig(c);
  EXPECT_NE(s.message().find("leave --num-layers-per-virtual-pipeline-stage "
                             "unset"),
            std::string::npos)
      << s;
  c.layers_per_virtual_stage = 0;
  EXPECT_TRUE(ValidatePipelineConfig(c).ok());
  // A stage with an odd count cannot be halved.
  c.first_stage_layers = 3;
  c.num_layers = 9;
  s = ValidatePipelineConfig(c);
  EXPECT_NE(s.message().find("give stage 0 3 of 9 layers"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("--decoder-first-pipeline-num-layers 3"),
            std::string::npos)
      << s;
}

TEST(LayerSplitTest, InterleavedNeedsMicroBatchesDivisibleByStages) {
  PipelineConfig c;
  c.num_layers = 8;
  c.pipeline_size = 4;
  c.layers_per_virtual_stage = 1;
  EXPECT_TRUE(ValidateMicroBatches(c, 8).ok());
  auto s = ValidateMicroBatches(c, 6);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multiple of --pipeline-model-parallel-size 4"),
            std::string::npos)
      << s;
  EXPECT_FALSE(ValidateMicroBatches(c, 0).ok());
  c.layers_per_virtual_stage = 0;
  EXPECT_TRUE(ValidateMicroBatches(c, 6).ok());
}

}  // namespace
}  // namespace pipeline
}  // namespace mcc
