// Faults: timeouts, dead ranks, mismatched collectives, wrong buffers. Each
// scenario runs real processes and asserts their exit codes and messages.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

using ::testing::HasSubstr;
using testing::RunWorkers;
using testing::WorkerResult;

constexpr int kCollectiveFailed = 3;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

absl::StatusOr<World> Init(absl::Duration timeout) {
  GroupOptions options;
  options.timeout = timeout;
  return InitWorldFromEnvironment(options);
}

int Report(const absl::Status& s) {
  fprintf(stderr, "ERROR: %s\n", s.ToString().c_str());
  return kCollectiveFailed;
}

// The last rank never joins the all-reduce; the others time out after 1 s.
MCC_WORKER(timeout) {
  absl::StatusOr<World> world = Init(absl::Seconds(20));
  if (!world.ok()) return Report(world.status());
  if (world->group->rank() == world->group->size() - 1) {
    absl::SleepFor(absl::Seconds(4));
    return 0;
  }
  Tensor t = Tensor::Full({5}, 1.0, DType::kFloat32);
  CollectiveOptions opts;
  opts.timeout = absl::Seconds(1);
  absl::Status s = world->group->AllReduceSync(&t, ReduceOp::kSum, opts);
  if (s.ok()) return 0;
  return Report(s);
}

TEST(FaultTest, TimeoutNamesOperationGroupRankAndSequence) {
  std::vector<WorkerResult> results =
      RunWorkers(3, "timeout", absl::Seconds(30));
  for (int r = 0; r < 2; ++r) {
    const WorkerResult& w = results[r];
    EXPECT_EQ(w.exit_code, kCollectiveFailed) << testing::Describe(results);
    EXPECT_THAT(w.output, HasSubstr("AllReduce(sum, fp32[5])"));
    EXPECT_THAT(w.output, HasSubstr("sequence number 0"));
    EXPECT_THAT(w.output, HasSubstr("group 'world'"));
    EXPECT_THAT(w.output, HasSubstr(absl::StrCat("on rank ", r, " of 3")));
    EXPECT_THAT(w.output, HasSubstr("did not complete within its timeout"));
    EXPECT_LT(w.elapsed, absl::Seconds(4)) << testing::Describe(results);
  }
  EXPECT_EQ(results[2].exit_code, 0) << testing::Describe(results);
}

// MCC_TEST_DEAD_RANK kills itself after the first barrier; the others then
// all-reduce with a 5 s timeout and must fail, naming the lost rank.
MCC_WORKER(dead_rank) {
  absl::StatusOr<World> world = Init(absl::Seconds(5));
  if (!world.ok()) return Report(world.status());
  absl::Status s = world->group->BarrierSync();
  if (!s.ok()) return Report(s);
  if (world->group->rank() == std::atoi(std::getenv("MCC_TEST_DEAD_RANK"))) {
    raise(SIGKILL);
  }
  absl::SleepFor(absl::Milliseconds(200));
  Tensor t = Tensor::Full({1000}, 1.0, DType::kFloat32);
  s = world->group->AllReduceSync(&t, ReduceOp::kSum);
  if (s.ok()) s = world->group->BarrierSync();
  if (s.ok()) return 0;
  return Report(s);
}

void ExpectLostRank(int world_size, int dead) {
  std::vector<WorkerResult> results =
      RunWorkers(world_size, "dead_rank", absl::Seconds(30), [dead](int) {
        return std::map<std::string, std::string>{
            {"MCC_TEST_DEAD_RANK", std::to_string(dead)}};
      });
  EXPECT_EQ(results[dead].exit_code, 128 + SIGKILL);
  for (const WorkerResult& w : results) {
    if (w.rank == dead) continue;
    EXPECT_EQ(w.exit_code, kCollectiveFailed) << testing::Describe(results);
    EXPECT_THAT(w.output, HasSubstr(absl::StrCat("lost rank ", dead)))
        << testing::Describe(results);
    EXPECT_FALSE(w.timed_out);
    EXPECT_LT(w.elapsed, absl::Seconds(9)) << testing::Describe(results);
  }
}

TEST(FaultTest, DeadRankIsNamedByEveryOtherRank) { ExpectLostRank(4, 2); }

TEST(FaultTest, DeadStoreHostIsNamedByEveryOtherRank) { ExpectLostRank(3, 0); }

// With collective checking on, rank 1 makes a different call.
MCC_WORKER(mismatch) {
  absl::StatusOr<World> world = Init(absl::Seconds(10));
  if (!world.ok()) return Report(world.status());
  ProcessGroup& pg = *world->group;
  const std::string kind = Env("MCC_TEST_MISMATCH");
  const bool odd_one = pg.rank() == 1;
  absl::Status s;
  if (kind == "subgroup_order") {
    std::vector<int> ranks = {0, 1, 2};
    if (odd_one) ranks = {2, 1, 0};
    s = pg.NewSubgroup(ranks).status();
  } else if (kind == "op" && odd_one) {
    Tensor in = Tensor::Zeros({4}, DType::kFloat32);
    Tensor out = Tensor::Zeros({4 * pg.size()}, DType::kFloat32);
    s = pg.AllGatherSync(in, &out);
  } else {
    DType dt = kind == "dtype" && odd_one ? DType::kBFloat16 : DType::kFloat32;
    int64_t n = kind == "count" && odd_one ? 5 : 4;
    Tensor t = Tensor::Zeros({n}, dt);
    s = pg.AllReduceSync(&t, ReduceOp::kSum);
  }
  if (s.ok()) return 0;
  return Report(s);
}

void ExpectMismatch(const std::string& kind, const std::string& mine,
                    const std::string& theirs, bool debug = true) {
  std::vector<WorkerResult> results =
      RunWorkers(3, "mismatch", absl::Seconds(30), [&](int) {
        return std::map<std::string, std::string>{
            {"MCC_TEST_MISMATCH", kind},
            {"MCC_DEBUG_COLLECTIVES", debug ? "1" : "0"}};
      });
  for (const WorkerResult& w : results) {
    EXPECT_EQ(w.exit_code, kCollectiveFailed) << testing::Describe(results);
    EXPECT_THAT(w.output, HasSubstr("mismatch")) << testing::Describe(results);
    EXPECT_LT(w.elapsed, absl::Seconds(8));
    if (w.rank == 1) {
      EXPECT_THAT(w.output, HasSubstr("this rank 1 called " + theirs));
      EXPECT_THAT(w.output, HasSubstr("rank 0 called " + mine));
    } else {
      EXPECT_THAT(w.output, HasSubstr(absl::StrCat("this rank ", w.rank,
                                                   " called ", mine)));
      EXPECT_THAT(w.output, HasSubstr("rank 1 called " + theirs));
    }
  }
}

TEST(FaultTest, MismatchedOperation) {
  ExpectMismatch("op", "AllReduce(sum, fp32[4])",
                 "AllGather(fp32[4] -> fp32[12])");
}

TEST(FaultTest, MismatchedDtype) {
  ExpectMismatch("dtype", "AllReduce(sum, fp32[4])", "AllReduce(sum, bf16[4])");
}

TEST(FaultTest, MismatchedCount) {
  ExpectMismatch("count", "AllReduce(sum, fp32[4])", "AllReduce(sum, fp32[5])");
}

TEST(FaultTest, MismatchedSubgroupRankOrder) {
  ExpectMismatch("subgroup_order", "NewSubgroup([0,1,2])",
                 "NewSubgroup([2,1,0])");
}

TEST(FaultTest, MismatchedSubgroupRankOrderWithoutDebug) {
  // Subgroup rank lists are always compared among the members.
  ExpectMismatch("subgroup_order", "NewSubgroup([0,1,2])",
                 "NewSubgroup([2,1,0])", /*debug=*/false);
}

// Wrong buffers are refused on the calling rank before anything moves; the
// group stays usable (both ranks make the same wrong calls, then a right
// one).
MCC_WORKER(bad_buffers) {
  absl::StatusOr<World> world = Init(absl::Seconds(10));
  if (!world.ok()) return Report(world.status());
  ProcessGroup& pg = *world->group;
  const int n = pg.size();
  int wrong = 0;
  auto expect_invalid = [&](const absl::Status& s, const std::string& what,
                            const std::string& needle) {
    if (s.code() != absl::StatusCode::kInvalidArgument ||
        !absl::StrContains(s.message(), needle)) {
      fprintf(stderr, "%s: got %s, want InvalidArgument with '%s'\n",
              what.c_str(), s.ToString().c_str(), needle.c_str());
      ++wrong;
    } else {
      printf("%s refused: %s\n", what.c_str(), s.ToString().c_str());
    }
  };
  Tensor in = Tensor::Zeros({4, 3}, DType::kFloat32);
  Tensor out = Tensor::Zeros({4 * n + 1, 3}, DType::kFloat32);
  expect_invalid(pg.AllGatherSync(in, &out), "AllGather size",
                 "must be fp32[8, 3]");
  Tensor out_dt = Tensor::Zeros({4 * n, 3}, DType::kInt32);
  expect_invalid(pg.AllGatherSync(in, &out_dt), "AllGather dtype",
                 "must be fp32");
  Tensor rs_out = Tensor::Zeros({3, 3}, DType::kFloat32);
  expect_invalid(pg.ReduceScatterSync(in, &rs_out, ReduceOp::kSum),
                 "ReduceScatter size", "must be fp32[6, 3]");
  expect_invalid(pg.AllGatherVSync(in, &out, {4}), "AllGatherV counts",
                 "rows_per_rank has 1 entries");
  Tensor a2a = Tensor::Zeros({3}, DType::kFloat32);
  Tensor a2a_out = Tensor::Zeros({3}, DType::kFloat32);
  expect_invalid(pg.AllToAllSync(a2a, &a2a_out), "AllToAll divisibility",
                 "divisible");
  expect_invalid(pg.BroadcastSync(&in, n), "Broadcast root", "root 2");
  expect_invalid(pg.SendSync(in, pg.rank()), "Send to self", "destination");
  // A tensor on another device: "CUDA" memory from a host allocator, only
  // so that such a tensor exists on a machine without a GPU.
  struct FakeCuda : Allocator {
    Device device() const override { return Device::CUDA(0); }
    void* RawAllocate(size_t bytes) override { return std::malloc(bytes); }
    void RawFree(void* p, size_t) override { std::free(p); }
  };
  RegisterAllocator(DeviceType::kCUDA,
                    [](int) -> Allocator* { return new FakeCuda; });
  Tensor gpu = Tensor::Empty({4}, DType::kFloat32, Device::CUDA(0));
  expect_invalid(pg.AllReduceSync(&gpu, ReduceOp::kSum), "device",
                 "on cuda:0 but the gloo backend");
  // Nothing above moved data or used a sequence number.
  if (pg.sequence_number() != 0) {
    fprintf(stderr, "sequence number %lld after refused calls\n",
            static_cast<long long>(pg.sequence_number()));
    ++wrong;
  }
  Tensor t = Tensor::Full({3}, pg.rank() + 1, DType::kFloat32);
  absl::Status s = pg.AllReduceSync(&t, ReduceOp::kSum);
  if (!s.ok()) return Report(s);
  if (t.ToDoubles()[0] != n * (n + 1) / 2) ++wrong;
  return wrong == 0 ? 0 : 1;
}

TEST(FaultTest, WrongBuffersRefusedBeforeAnythingMoves) {
  std::vector<WorkerResult> results =
      RunWorkers(2, "bad_buffers", absl::Seconds(30));
  for (const WorkerResult& w : results) {
    EXPECT_EQ(w.exit_code, 0) << testing::Describe(results);
  }
}

}  // namespace
}  // namespace comm
}  // namespace mcc
