#include "parallel/rank_layout.h"

#include <algorithm>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every rank appears in exactly one group, and all groups have one size.
void ExpectPartition(const std::vector<std::vector<int>>& groups, int world,
                     size_t group_size) {
  std::multiset<int> seen;
  for (const auto& g : groups) {
    EXPECT_EQ(g.size(), group_size);
    seen.insert(g.begin(), g.end());
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) EXPECT_EQ(seen.count(r), 1u) << r;
}

TEST(RankLayoutTest, MegatronExampleSixteenRanks) {
  // Megatron's documented example: 16 ranks, TP 2, PP 4 -> DP 2.
  RankLayout l = *RankLayout::Create(16, {/*tensor=*/2, /*pipeline=*/4, 1});
  EXPECT_EQ(l.data_size(), 2);
  EXPECT_THAT(
      l.TensorGroups(),
      ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3), ElementsAre(4, 5),
                  ElementsAre(6, 7), ElementsAre(8, 9), ElementsAre(10, 11),
                  ElementsAre(12, 13), ElementsAre(14, 15)));
  EXPECT_THAT(
      l.DataGroups(),
      ElementsAre(ElementsAre(0, 2), ElementsAre(1, 3), ElementsAre(4, 6),
                  ElementsAre(5, 7), ElementsAre(8, 10), ElementsAre(9, 11),
                  ElementsAre(12, 14), ElementsAre(13, 15)));
  EXPECT_THAT(
      l.PipelineGroups(),
      ElementsAre(ElementsAre(0, 4, 8, 12), ElementsAre(1, 5, 9, 13),
                  ElementsAre(2, 6, 10, 14), ElementsAre(3, 7, 11, 15)));
  EXPECT_THAT(l.EmbeddingGroups(),
              ElementsAre(ElementsAre(0, 12), ElementsAre(1, 13),
                          ElementsAre(2, 14), ElementsAre(3, 15)));
  EXPECT_THAT(l.ModelGroups()[0], ElementsAre(0, 1, 4, 5, 8, 9, 12, 13));
}

TEST(RankLayoutTest, CoordinatesRoundTripAndGroupsPartition) {
  for (int tp : {1, 2, 4}) {
    for (int cp : {1, 2}) {
      for (int pp : {1, 2}) {
        const int world = tp * cp * pp * 2;
        RankLayout l = *RankLayout::Create(world, {tp, pp, cp});
        for (int r = 0; r < world; ++r) {
          const RankCoordinates c = l.Coordinates(r);
          EXPECT_EQ(l.RankOf(c), r);
          // A rank's index in its TP group is its TP coordinate.
          const std::vector<int> tg = RankLayout::GroupOf(l.TensorGroups(), r);
          EXPECT_EQ(std::find(tg.begin(), tg.end(), r) - tg.begin(), c.tp);
          const std::vector<int> pg =
              RankLayout::GroupOf(l.PipelineGroups(), r);
          EXPECT_EQ(std::find(pg.begin(), pg.end(), r) - pg.begin(), c.pp);
        }
        ExpectPartition(l.TensorGroups(), world, tp);
        ExpectPartition(l.PipelineGroups(), world, pp);
        ExpectPartition(l.ContextGroups(), world, cp);
        ExpectPartition(l.DataGroups(), world, 2);
        ExpectPartition(l.DataContextGroups(), world, 2 * cp);
        ExpectPartition(l.TensorContextGroups(), world, tp * cp);
        ExpectPartition(l.ModelGroups(), world, tp * pp);
      }
    }
  }
}

TEST(RankLayoutTest, IndivisibleWorldShowsTheNumbers) {
  absl::Status s = RankLayout::Create(6, {4, 1, 1}).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("world size 6"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor-model-parallel-size (4)"));
  EXPECT_FALSE(RankLayout::Create(4, {0, 1, 1}).ok());
}

// Megatron-Core's expert rank generator (order tp-ep-dp-pp, no CP) for 16
// ranks, TP 2, PP 2 (DP 4) and EP 2 with ETP 1 (EDP 4): expert rank =
// ep + 2 * edp + 8 * pp.
TEST(RankLayoutTest, MegatronExpertLayoutSixteenRanksEp2Etp1) {
  ParallelSizes sizes;
  sizes.tensor = 2;
  sizes.pipeline = 2;
  sizes.expert_model = 2;
  sizes.expert_tensor = 1;
  RankLayout l = *RankLayout::Create(16, sizes);
  EXPECT_EQ(l.data_size(), 4);
  EXPECT_EQ(l.expert_data_size(), 4);
  EXPECT_THAT(
      l.ExpertModelGroups(),
      ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3), ElementsAre(4, 5),
                  ElementsAre(6, 7), ElementsAre(8, 9), ElementsAre(10, 11),
                  ElementsAre(12, 13), ElementsAre(14, 15)));
  EXPECT_THAT(
      l.ExpertDataGroups(),
      ElementsAre(ElementsAre(0, 2, 4, 6), ElementsAre(1, 3, 5, 7),
                  ElementsAre(8, 10, 12, 14), ElementsAre(9, 11, 13, 15)));
  EXPECT_EQ(l.ExpertTensorGroups().size(), 16u);
  EXPECT_THAT(l.ExpertTensorModelGroups(), l.ExpertModelGroups());
  // The dense data groups are different ranks: attention keeps its own DP.
  EXPECT_THAT(l.DataGroups()[0], ElementsAre(0, 2, 4, 6));
  EXPECT_THAT(l.DataGroups()[1], ElementsAre(1, 3, 5, 7));
  EXPECT_THAT(l.TensorGroups()[0], ElementsAre(0, 1));
  const ExpertCoordinates c = l.ExpertCoordinatesOf(13);
  EXPECT_EQ(c.etp, 0);
  EXPECT_EQ(c.ep, 1);
  EXPECT_EQ(c.edp, 2);
  EXPECT_EQ(c.pp, 1);
  EXPECT_THAT(l.ToString(), HasSubstr("experts ETP 1 x EP 2 x EDP 4 x PP 2"));
}

// 8 ranks, TP 2, EP 2, ETP 2 (EDP 2): expert rank = etp + 2 * ep + 4 * edp.
TEST(RankLayoutTest, MegatronExpertLayoutEightRanksEp2Etp2) {
  ParallelSizes sizes;
  sizes.tensor = 2;
  sizes.expert_model = 2;
  sizes.expert_tensor = 2;
  RankLayout l = *RankLayout::Create(8, sizes);
  EXPECT_EQ(l.expert_data_size(), 2);
  EXPECT_THAT(l.ExpertTensorGroups(),
              ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3),
                          ElementsAre(4, 5), ElementsAre(6, 7)));
  EXPECT_THAT(l.ExpertModelGroups(),
              ElementsAre(ElementsAre(0, 2), ElementsAre(1, 3),
                          ElementsAre(4, 6), ElementsAre(5, 7)));
  EXPECT_THAT(l.ExpertTensorModelGroups(),
              ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(4, 5, 6, 7)));
  EXPECT_THAT(l.ExpertDataGroups(),
              ElementsAre(ElementsAre(0, 4), ElementsAre(1, 5),
                          ElementsAre(2, 6), ElementsAre(3, 7)));
}

TEST(RankLayoutTest, ExpertGroupsPartitionAndShareThePipeline) {
  for (int tp : {1, 2}) {
    for (int cp : {1, 2}) {
      for (int pp : {1, 2}) {
        for (int ep : {1, 2, 4}) {
          for (int etp : {1, 2}) {
            const int world = 8 * pp;
            ParallelSizes sizes{tp, pp, cp, ep, etp};
            auto l = RankLayout::Create(world, sizes);
            if (world % (tp * cp * pp) != 0 || world % (etp * ep * pp) != 0) {
              EXPECT_FALSE(l.ok());
              continue;
            }
            ASSERT_TRUE(l.ok()) << l.status();
            const int edp = world / (etp * ep * pp);
            ExpectPartition(l->ExpertModelGroups(), world, ep);
            ExpectPartition(l->ExpertTensorGroups(), world, etp);
            ExpectPartition(l->ExpertTensorModelGroups(), world, etp * ep);
            ExpectPartition(l->ExpertDataGroups(), world, edp);
            for (int r = 0; r < world; ++r) {
              const ExpertCoordinates c = l->ExpertCoordinatesOf(r);
              EXPECT_EQ(c.pp, l->Coordinates(r).pp) << r;
              const std::vector<int> g =
                  RankLayout::GroupOf(l->ExpertModelGroups(), r);
              EXPECT_EQ(std::find(g.begin(), g.end(), r) - g.begin(), c.ep);
            }
          }
        }
      }
    }
  }
}

// With EP 1 and ETP = TP the experts' data group is the dense DP x CP group
// (Megatron reduces expert gradients over it).
TEST(RankLayoutTest, WithoutExpertParallelismExpertDataIsDataContext) {
  ParallelSizes sizes{2, 2, 2};
  RankLayout l = *RankLayout::Create(16, sizes);
  EXPECT_EQ(l.ExpertDataGroups(), l.DataContextGroups());
  EXPECT_EQ(l.ExpertTensorGroups(), l.TensorGroups());
  EXPECT_EQ(l.ToString(), "world 16 = TP 2 x CP 2 x DP 2 x PP 2");
}

TEST(RankLayoutTest, IndivisibleExpertLayoutNamesTheFlags) {
  ParallelSizes sizes;
  sizes.expert_model = 4;
  sizes.expert_tensor = 2;
  absl::Status s = RankLayout::Create(4, sizes).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("expert-tensor-parallel-size (2) x "
                        "expert-model-parallel-size (4)"));
  sizes.expert_model = 0;
  EXPECT_THAT(std::string(RankLayout::Create(4, sizes).status().message()),
              HasSubstr("expert-model-parallel-size 0"));
}

// HSDP: DP 4 in two instances of contiguous ranks, replicated across.
TEST(RankLayoutTest, InstancesAreContiguousRunsOfTheDataGroup) {
  ParallelSizes sizes;
  sizes.tensor = 2;
  sizes.distributed_optimizer_instances = 2;
  auto l = RankLayout::Create(8, sizes);  // TP 2 x DP 4.
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->InstanceGroups(),
            (std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(l->CrossInstanceGroups(),
            (std::vector<std::vector<int>>{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  // Each instance (with its TP peers) is ranks 0-3 or 4-7: one node of 4.
  EXPECT_THAT(l->ToString(), HasSubstr("2 distributed optimizer instances"));
  ExpectPartition(l->InstanceGroups(), 8, 2);
  ExpectPartition(l->CrossInstanceGroups(), 8, 2);
}

// HSDP with experts: each EDP group cut into instances the same way.
TEST(RankLayoutTest, ExpertInstancesSplitTheExpertDataGroup) {
  ParallelSizes sizes;
  sizes.expert_model = 2;
  sizes.distributed_optimizer_instances = 2;
  auto l = RankLayout::Create(8, sizes);  // DP 8, EP 2, EDP 4.
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->ExpertDataGroups(),
            (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l->ExpertInstanceGroups(),
            (std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(l->ExpertCrossInstanceGroups(),
            (std::vector<std::vector<int>>{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  // 4 instances of DP 8 fit, but not of EDP 2 at EP 4.
  sizes.expert_model = 4;
  sizes.distributed_optimizer_instances = 4;
  absl::Status s = RankLayout::Create(8, sizes).status();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("--num-distributed-optimizer-instances 4 must divide "
                        "the expert-data-parallel size 2"));
}

TEST(RankLayoutTest, InstancesMustDivideDataParallelism) {
  ParallelSizes sizes;
  sizes.distributed_optimizer_instances = 3;
  absl::Status s = RankLayout::Create(4, sizes).status();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("--num-distributed-optimizer-instances 3"));
  sizes.distributed_optimizer_instances = 4;
  EXPECT_TRUE(RankLayout::Create(4, sizes).ok());
}

}  // namespace
}  // namespace parallel
}  // namespace mcc
