#include "planner/layout_search.h"

#include <set>

#include "absl/strings/str_cat.h"
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

// Context parallelism is a train layout: the search offers it (ring
// attention, split activations) unless attention dropout rules it out, as
// train does.
TEST(LayoutSearchTest, ContextParallelLayoutsAreOfferedUnlessDropoutForbids) {
  JobSpec job = Job();
  int with_cp = 0;
  for (const Prediction& p : SearchLayouts(job, {})) {
    if (p.layout.cp > 1) ++with_cp;
  }
  EXPECT_GT(with_cp, 0);
  // CP 2 halves each rank's tokens: its layer activations, and no more
  // than CP 1's peak.
  auto cp1 = Predict(job, *ParseLayout("tp1.pp1.dp8.cp1.z1.rnone.mb1"));
  auto cp2 = Predict(job, *ParseLayout("tp1.pp1.dp4.cp2.z1.rnone.mb1"));
  ASSERT_TRUE(cp1.ok() && cp2.ok());
  EXPECT_LT(cp2->memory.activations, cp1->memory.activations);
  EXPECT_GT(cp2->time.cp_comm + cp2->time.cp_comm_hidden, 0);
  job.model.attention_dropout = 0.1;
  for (const Prediction& p : SearchLayouts(job, {})) {
    EXPECT_EQ(p.layout.cp, 1) << p.layout.Name();
  }
  EXPECT_NE(UnsupportedHere(job, cp2->layout).find("--attention-dropout"),
            std::string::npos);
}

TEST(LayoutSearchTest, TooSmallADeviceDropsLayouts) {
  JobSpec job = Job();
  job.model.attention_dropout = 0.1;  // CP layouts become unsupported.
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

// A measured device's table says which leading layouts sit within its
// probe's run-to-run spread of the first; the datasheet devices' does not.
TEST(LayoutSearchTest, TableNotesLayoutsWithinTheProbesSpread) {
  JobSpec job = Job();
  std::vector<Prediction> ps(4);
  const double steps[] = {1.00, 1.03, 1.05, 1.20};
  for (size_t i = 0; i < ps.size(); ++i) {
    ps[i].time.gemm = steps[i];
    ps[i].fits = true;
  }
  EXPECT_EQ(FormatTable(job, ps).find("note:"), std::string::npos);
  job.cluster.device.prediction_spread = 0.05;
  const std::string table = FormatTable(job, ps);
  EXPECT_NE(table.find("note: layouts 1-3 are predicted within 5%"),
            std::string::npos)
      << table;
  ps.pop_back();  // Every layout shown is within it.
  EXPECT_NE(
      FormatTable(job, ps).find("layouts 1-3 (all shown; --top shows more)"),
      std::string::npos);
  ps.push_back(ps.back());
  ps.back().time.gemm = 1.20;
  job.cluster.device.prediction_spread = 0.01;
  EXPECT_EQ(FormatTable(job, ps).find("note:"), std::string::npos);
}

// A probe whose GEMM readings disagreed by more than kProbeDriftWarning
// says so under the table, the breakdown and in the JSON.
TEST(LayoutSearchTest, ReportsSayWhenTheProbeDrifted) {
  JobSpec job = Job();
  auto p = Predict(job, *ParseLayout("tp2sp.pp2.dp2.z1.mb1"));
  ASSERT_TRUE(p.ok()) << p.status();
  const std::string note = "GEMM rate moved";
  job.cluster.device.probe_drift = kProbeDriftWarning;  // At the threshold.
  EXPECT_EQ(FormatTable(job, {*p}).find(note), std::string::npos);
  EXPECT_EQ(FormatExplain(job, *p).find(note), std::string::npos);
  job.cluster.device.probe_drift = 0.4;
  EXPECT_NE(FormatTable(job, {*p}).find("moved 40% during the probe"),
            std::string::npos)
      << FormatTable(job, {*p});
  EXPECT_NE(FormatExplain(job, *p).find(note), std::string::npos);
  const auto json = nlohmann::json::parse(FormatJson(job, {*p}));
  EXPECT_DOUBLE_EQ(json["cluster"]["probe_drift"].get<double>(), 0.4);
}

// Megatron's estimate is its formula's, which assumes an even split; an
// uneven layout's breakdown says so and gives the formula on its own first
// stage beside it.
TEST(LayoutSearchTest, MegatronsEstimateSaysItAssumesAnEvenSplit) {
  const JobSpec job = Job();
  const std::string note = "its formula assumes an even split (4 layers";
  auto even = Predict(job, *ParseLayout("tp1.pp2.dp4.z1.mb1"));
  ASSERT_TRUE(even.ok()) << even.status();
  EXPECT_EQ(FormatExplain(job, *even).find(note), std::string::npos);
  auto uneven = Predict(job, *ParseLayout("tp1.pp2.dp4.z1.mb1.first6"));
  ASSERT_TRUE(uneven.ok()) << uneven.status();
  const std::string text = FormatExplain(job, *uneven);
  EXPECT_NE(text.find(absl::StrCat(note,
                                   " on the first stage); with this "
                                   "layout's 6 there")),
            std::string::npos)
      << text;
  const auto json = nlohmann::json::parse(FormatJson(job, {*uneven}));
  const auto& memory = json["layouts"][0]["memory"];
  EXPECT_GT(memory["megatron_formula_first_stage"].get<double>(),
            memory["megatron_theoretical"].get<double>());
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
