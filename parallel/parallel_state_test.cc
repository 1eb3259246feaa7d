#include "parallel/parallel_state.h"

#include <cstdio>

#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace parallel {
namespace {

// Each rank checks that its groups hold exactly the ranks the layout names
// and that an all-reduce of the world rank over each group sums them.
MCC_WORKER(groups) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(30);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) return 3;
  auto state = ParallelState::Create(world->group, {2, 2, 1});
  if (!state.ok()) {
    std::fprintf(stderr, "%s\n", state.status().ToString().c_str());
    return 4;
  }
  const int rank = world->group->rank();
  const RankLayout& l = (*state)->layout();
  struct Check {
    comm::ProcessGroup* group;
    std::vector<std::vector<int>> groups;
  } checks[] = {{(*state)->tensor(), l.TensorGroups()},
                {(*state)->pipeline(), l.PipelineGroups()},
                {(*state)->data(), l.DataGroups()},
                {(*state)->model(), l.ModelGroups()},
                {(*state)->embedding(), l.EmbeddingGroups()}};
  for (const Check& c : checks) {
    const std::vector<int> expected = RankLayout::GroupOf(c.groups, rank);
    if (c.group->global_ranks() != expected) return 5;
    Tensor t = Tensor::Full({1}, rank, DType::kInt64);
    if (!c.group->AllReduceSync(&t, comm::ReduceOp::kSum).ok()) return 6;
    int64_t sum = 0;
    for (int r : expected) sum += r;
    if (t.data<int64_t>()[0] != sum) return 7;
  }
  return 0;
}

TEST(ParallelStateTest, EightRanksTp2Pp2Dp2) {
  auto results = comm::testing::RunWorkers(8, "groups", absl::Seconds(90));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
}

}  // namespace
}  // namespace parallel
}  // namespace mcc
