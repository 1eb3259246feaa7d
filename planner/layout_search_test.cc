#include "planner/layout_search.h"

#include <set>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner/plan_report.h"

namespace mcc {
namespace planner {
namespace {

JobSpec Job() {
  JobSpec job;
  job.model.num_layers = 8;
  job.model.hidden_size = 1024;
  job.model.num_attention_heads = 16;
  job.model.vocab_size = 32000;
  job.model.seq_length = 2048;
  job.dtype = DType::kBFloat16;
  job.global_batch = 32;
  job.cluster.device = *ShippedDevice("h100");
  job.cluster.devices_per_node = 8;
  job.cluster.nodes = 1;
  return job;
}

TEST(LayoutSearchTest, EveryLayoutDividesFitsAndIsSortedByTime) {
  const JobSpec job = Job();
  const std::vector<Prediction> all = SearchLayouts(job, {});
  ASSERT_GT(all.size(), 10u);
  std::set<std::string> names;
  for (size_t i = 0; i < all.size(); ++i) {
    const Prediction& p = all[i];
    EXPECT_TRUE(names.insert(p.layout.Name()).second) << p.layout.Name();
    EXPECT_EQ(p.layout.world(), 8);
    EXPECT_TRUE(p.fits);
    EXPECT_TRUE(p.unsupported.empty()) << p.layout.Name();
    EXPECT_LE(p.layout.tp, 8);
    if (i > 0) EXPECT_LE(all[i - 1].time.total(), p.time.total());
  }
}

TEST(LayoutSearchTest, TooSmallADeviceDropsLayouts) {
  JobSpec job = Job();
  const size_t roomy = SearchLayouts(job, {}).size();
  job.cluster.device.memory_bytes = 2e9;
  const std::vector<Prediction> tight = SearchLayouts(job, {});
  EXPECT_LT(tight.size(), roomy);
  for (const Prediction& p : tight) EXPECT_LE(p.memory.total(), 2e9);
  SearchOptions all;
  all.include_not_fitting = true;
  all.include_unsupported = true;
  EXPECT_GT(SearchLayouts(job, all).size(), roomy);
}

TEST(LayoutSearchTest, ReportsNameEveryPart) {
  const JobSpec job = Job();
  auto p = Predict(job, *ParseLayout("tp2sp.pp2.dp2.z1.mb1"));
  ASSERT_TRUE(p.ok()) << p.status();
  const std::string text = FormatExplain(job, *p);
  for (const char* part :
       {"weights", "gradients", "main weights", "optimizer state",
        "activations", "comm buffers", "workspace", "allocator overhead",
        "Megatron", "GEMMs", "TP communication", "DP communication",
        "PP communication", "pipeline bubble", "optimizer", "MFU"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  const auto json = nlohmann::json::parse(FormatJson(job, {*p}));
  EXPECT_EQ(json["layouts"][0]["layout"], "tp2sp.pp2.dp2.cp1.z1.rnone.mb1");
  EXPECT_DOUBLE_EQ(json["layouts"][0]["memory"]["total"].get<double>(),
                   p->memory.total());
  EXPECT_FALSE(Predict(job, *ParseLayout("tp3.dp2")).ok());
}

}  // namespace
}  // namespace planner
}  // namespace mcc
