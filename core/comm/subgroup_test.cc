// Subgroups: created collectively from rank lists, members only, nested,
// in any rank order, with collectives and point-to-point inside them.
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

int Fail(const std::string& what, const absl::Status& s) {
  fprintf(stderr, "%s failed: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

int Check(bool ok, const std::string& what) {
  if (!ok) fprintf(stderr, "check failed: %s\n", what.c_str());
  return ok ? 0 : 1;
}

MCC_WORKER(subgroups) {
  GroupOptions options;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<World> world = InitWorldFromEnvironment(options);
  if (!world.ok()) return Fail("init", world.status());
  ProcessGroup& pg = *world->group;
  const int n = pg.size();
  const int r = pg.rank();
  int failures = 0;
  std::vector<int> evens, odds;
  for (int q = 0; q < n; ++q) (q % 2 == 0 ? evens : odds).push_back(q);
  absl::StatusOr<std::shared_ptr<ProcessGroup>> even = pg.NewSubgroup(evens);
  if (!even.ok()) return Fail("NewSubgroup(evens)", even.status());
  absl::StatusOr<std::shared_ptr<ProcessGroup>> odd = pg.NewSubgroup(odds);
  if (!odd.ok()) return Fail("NewSubgroup(odds)", odd.status());
  std::shared_ptr<ProcessGroup> mine = r % 2 == 0 ? *even : *odd;
  std::shared_ptr<ProcessGroup> other = r % 2 == 0 ? *odd : *even;
  failures += Check(mine != nullptr && other == nullptr, "membership");
  const std::vector<int>& members = r % 2 == 0 ? evens : odds;
  failures += Check(mine->size() == static_cast<int>(members.size()), "size");
  failures += Check(mine->global_ranks() == members, "global ranks");
  failures += Check(mine->rank() == r / 2, "rank in subgroup");

  // Sum of (global rank + 1) over the members only.
  Tensor t = Tensor::Full({7}, r + 1, DType::kInt64);
  absl::Status s = mine->AllReduceSync(&t, ReduceOp::kSum);
  if (!s.ok()) return Fail("subgroup AllReduce", s);
  int64_t want = 0;
  for (int q : members) want += q + 1;
  failures += Check(t.ToDoubles()[6] == want, "subgroup sum");

  // A subgroup in reversed order: its rank i is parent rank size-1-i, so an
  // all-gather of global ranks comes back reversed.
  std::vector<int> reversed(n);
  std::iota(reversed.rbegin(), reversed.rend(), 0);
  absl::StatusOr<std::shared_ptr<ProcessGroup>> rev = pg.NewSubgroup(reversed);
  if (!rev.ok()) return Fail("NewSubgroup(reversed)", rev.status());
  failures += Check((*rev)->rank() == n - 1 - r, "reversed rank");
  Tensor mine_t = Tensor::Full({1}, r, DType::kInt32);
  Tensor all = Tensor::Empty({n}, DType::kInt32);
  s = (*rev)->AllGatherSync(mine_t, &all);
  if (!s.ok()) return Fail("reversed AllGather", s);
  for (int i = 0; i < n; ++i) {
    failures += Check(all.ToDoubles()[i] == n - 1 - i, "reversed gather");
  }

  // Nested: the first two members of my subgroup, then send/recv in it.
  if (mine->size() >= 2) {
    absl::StatusOr<std::shared_ptr<ProcessGroup>> pair =
        mine->NewSubgroup({1, 0});
    if (!pair.ok()) return Fail("nested NewSubgroup", pair.status());
    if (*pair != nullptr) {
      const int peer = 1 - (*pair)->rank();
      failures += Check(
          (*pair)->global_ranks() == std::vector<int>({members[1], members[0]}),
          "nested global ranks");
      Tensor out = Tensor::Full({5}, r, DType::kFloat32);
      Tensor in = Tensor::Empty({5}, DType::kFloat32);
      auto send = (*pair)->Send(out, peer, 9);
      s = (*pair)->RecvSync(&in, peer, 9);
      if (s.ok()) s = send->Wait();
      if (!s.ok()) return Fail("nested Send/Recv", s);
      failures += Check(in.ToDoubles()[4] == (*pair)->global_ranks()[peer],
                        "nested recv");
    }
  }
  s = pg.BarrierSync();
  if (!s.ok()) return Fail("Barrier", s);
  return failures == 0 ? 0 : 1;
}

// Every rank leaves as soon as its groups exist: a fast rank exiting must
// not break a slower rank's half-finished connection to it.
MCC_WORKER(create_and_leave) {
  GroupOptions options;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<World> world = InitWorldFromEnvironment(options);
  if (!world.ok()) return Fail("init", world.status());
  std::vector<int> all(world->group->size());
  std::iota(all.begin(), all.end(), 0);
  absl::StatusOr<std::shared_ptr<ProcessGroup>> sub =
      world->group->NewSubgroup(all);
  if (!sub.ok()) return Fail("NewSubgroup", sub.status());
  return 0;
}

TEST(SubgroupTest, RanksLeavingRightAfterCreationDoNotBreakOthers) {
  // Measured without the creation barrier: 2 of 10 invocations of this test
  // failed (about one run of 8 ranks in 50), so it catches a regression
  // only some of the time; CI runs it on every submission.
  for (int run = 0; run < 10; ++run) {
    std::vector<testing::WorkerResult> results =
        testing::RunWorkers(8, "create_and_leave", absl::Seconds(60));
    for (const testing::WorkerResult& w : results) {
      ASSERT_EQ(w.exit_code, 0) << "run " << run << ":\n"
                                << testing::Describe(results);
    }
  }
}

TEST(SubgroupTest, MembersOnlyNestedAnyOrder) {
  for (int n : {2, 5}) {
    std::vector<testing::WorkerResult> results =
        testing::RunWorkers(n, "subgroups", absl::Seconds(60));
    for (const testing::WorkerResult& w : results) {
      EXPECT_EQ(w.exit_code, 0) << "world size " << n << ":\n"
                                << testing::Describe(results);
    }
  }
}

}  // namespace
}  // namespace comm
}  // namespace mcc
