// The cross-rank consistency checks on real training runs (gloo
// processes): with every replica group present (DP, TP with sequence
// parallelism, the tied embedding's two pipeline stages, ZeRO-3 under the
// pipeline) the weight-hash and gradient checks pass on every step; and
// each catches a deliberately broken path, naming the tensor, the kind of
// replica group and the ranks:
//   - one TP rank keeps its own partial gradient of one LayerNorm weight
//     instead of the sequence-parallel sum: the gradient check names it, the
//     two ranks and the difference;
//   - one TP rank's copy of the final LayerNorm weight is changed: the
//     weight hash names it across tensor-parallel replicas;
//   - the last stage's copy of the tied word embedding is changed: the
//     weight hash names it across the embedding group.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/mp_test_util.h"
#include "gtest/gtest.h"
#include "parallel/fsdp/sharding_strategy.h"
#include "parallel/parallel_state.h"
#include "training/testing/parity_test_util.h"
#include "training/testing/train_test_util.h"

namespace mcc {
namespace data_parallel {
namespace {

constexpr char kLayerNorm[] = "decoder.layers.0.input_layernorm.weight";
constexpr char kFinalNorm[] = "decoder.final_layernorm.weight";
constexpr char kEmbedding[] = "embedding.word_embeddings.weight";

struct Case {
  std::string name;
  int world = 2;
  int tp = 1;
  int pp = 1;
  fsdp::ShardingStrategy sharding = fsdp::ShardingStrategy::kNoShard;
  // Faults (on global rank 1).
  std::string skip_sp_reduce;
  std::string corrupt_weight;
};

std::vector<Case> Cases() {
  std::vector<Case> v;
  v.push_back({"healthy_tp2_pp2", 4, 2, 2});
  v.push_back({"healthy_tp2_dp2", 4, 2, 1});
  v.push_back({"healthy_pp2_dp2_zero3", 4, 1, 2,
               fsdp::ShardingStrategy::kOptimGradsParams});
  Case skip{"skip_sp_reduce_tp2", 2, 2};
  skip.skip_sp_reduce = kLayerNorm;
  v.push_back(skip);
  Case tp_weight{"corrupt_tp_replica", 2, 2};
  tp_weight.corrupt_weight = kFinalNorm;
  v.push_back(tp_weight);
  Case copy{"corrupt_embedding_copy", 2, 1, 2};
  copy.corrupt_weight = kEmbedding;
  v.push_back(copy);
  return v;
}

const Case& FindCase(const std::string& name) {
  static const auto* cases = new std::vector<Case>(Cases());
  return optim::testing::FindCase(*cases, name);
}

MCC_WORKER(consistency_train) {
  const Case& c = FindCase(std::getenv("MCC_TEST_CASE"));
  parallel::ParallelSizes sizes;
  sizes.tensor = c.tp;
  sizes.pipeline = c.pp;
  auto state = optim::testing::InitWorkerState(sizes);
  if (!state.ok()) return 3;
  const int rank = (*state)->world()->rank();
  optim::testing::TrainOptions o;
  o.model.num_layers = 2;
  o.steps = 3;
  o.global_microbatches = 4;
  o.sequence_parallel = c.tp > 1;
  o.pipeline.pipeline_size = c.pp;
  o.sharding = c.sharding;
  o.weight_hash_interval = 1;
  o.grad_consistency_interval = 1;
  if (rank == 1)
    o.ddp.skip_sequence_parallel_reduce_for_testing = c.skip_sp_reduce;
  o.corrupt_weight = c.corrupt_weight;
  o.corrupt_rank = 1;
  o.corrupt_step = 1;
  auto result = optim::testing::Train(o, state->get());
  if (!result.ok()) {
    std::printf("rank %d: %s\n", rank, result.status().ToString().c_str());
    return 4;
  }
  std::printf("rank %d: trained, every check passed\n", rank);
  return 0;
}

std::vector<comm::testing::WorkerResult> RunCase(const Case& c) {
  return comm::testing::RunWorkers(
      c.world, "consistency_train", absl::Seconds(300), [&](int) {
        return std::map<std::string, std::string>{{"MCC_TEST_CASE", c.name}};
      });
}

TEST(ConsistencyChecks, PassWhereEveryReplicaAgrees) {
  for (const char* name :
       {"healthy_tp2_pp2", "healthy_tp2_dp2", "healthy_pp2_dp2_zero3"}) {
    const auto results = RunCase(FindCase(name));
    for (const auto& r : results) {
      EXPECT_EQ(r.exit_code, 0) << name << "\n"
                                << comm::testing::Describe(results);
    }
  }
}

// Every rank of the failing group stops with the same error (no hang).
void ExpectEveryRankReports(
    const std::vector<comm::testing::WorkerResult>& results,
    const std::vector<std::string>& needles) {
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 4) << comm::testing::Describe(results);
    EXPECT_FALSE(r.timed_out);
    for (const std::string& needle : needles) {
      EXPECT_NE(r.output.find(needle), std::string::npos)
          << "rank " << r.rank << " lacks '" << needle << "':\n"
          << r.output;
    }
  }
  if (!results.empty()) std::printf("%s", results[0].output.c_str());
}

TEST(ConsistencyChecks, GradientCheckNamesTheSkippedSequenceParallelSum) {
  ExpectEveryRankReports(
      RunCase(FindCase("skip_sp_reduce_tp2")),
      {"gradient consistency check across tensor-parallel replicas",
       absl::StrCat("'", kLayerNorm, "'"), "tensor-parallel ranks 0 and 1",
       "by up to"});
}

TEST(ConsistencyChecks, WeightHashNamesTheChangedTensorParallelReplica) {
  ExpectEveryRankReports(
      RunCase(FindCase("corrupt_tp_replica")),
      {"weight hash check across tensor-parallel replicas",
       absl::StrCat("'", kFinalNorm, "'"), "tensor-parallel ranks {0}",
       "tensor-parallel ranks {1}"});
}

TEST(ConsistencyChecks, WeightHashNamesTheChangedEmbeddingCopy) {
  ExpectEveryRankReports(RunCase(FindCase("corrupt_embedding_copy")),
                         {"weight hash check across embedding replicas",
                          absl::StrCat("'", kEmbedding, "'"),
                          "embedding ranks {0}", "embedding ranks {1}"});
}

}  // namespace
}  // namespace data_parallel
}  // namespace mcc
