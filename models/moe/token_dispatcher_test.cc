// The dispatchers in real processes (gloo, 4 ranks): rows tagged with their
// source rank, expert and place arrive grouped by local expert, then by
// source, in the source's order; Combine brings every row back to its place.
// Uneven counts with empty experts and a rank that sends nothing; fp32 and
// bf16 (whose allgather Combine sums 16-bit pairs as int32 words), signed
// values, bit for bit.
#include "models/moe/token_dispatcher.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace moe {
namespace {

constexpr int kRanks = 4;
constexpr int64_t kExperts = 8;

// Rows rank s has for expert e (rank 3 has none; some experts none).
int64_t Count(int s, int64_t e) {
  if (s == 3) return 0;
  return (s * 3 + e * 5) % 4;
}

// Row value: source * 1000 + expert * 10 + place within (s, e).
float Tag(int s, int64_t e, int64_t i) { return s * 1000 + e * 10 + i; }

MCC_WORKER(dispatch) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(30);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok())
    return comm::testing::ReportFailure("init", world.status(), 3);
  const TokenDispatcherType type =
      *ParseTokenDispatcherType(std::getenv("MOE_DISPATCHER"));
  auto d = TokenDispatcher::Create(type, world->group.get(), kExperts);
  if (!d.ok()) return comm::testing::ReportFailure("create", d.status(), 4);
  const int me = world->group->rank();
  const DType dt = std::string(std::getenv("MOE_DTYPE")) == "bf16"
                       ? DType::kBFloat16
                       : DType::kFloat32;
  // bf16 rows of an even width take the word path.
  const int64_t h = dt == DType::kBFloat16 ? 4 : 3;
  auto sign = [](int64_t j) { return j % 2 == 1 ? -1.0f : 1.0f; };
  std::vector<int64_t> counts;
  std::vector<float> values;
  for (int64_t e = 0; e < kExperts; ++e) {
    counts.push_back(Count(me, e));
    for (int64_t i = 0; i < Count(me, e); ++i) {
      for (int64_t j = 0; j < h; ++j)
        values.push_back(sign(j) * (Tag(me, e, i) + 0.25f * j));
    }
  }
  const int64_t n = values.size() / h;
  Tensor rows = *Tensor::FromVector(values, {n, h}, dt);
  auto plan = (*d)->Plan(counts);
  if (!plan.ok()) return comm::testing::ReportFailure("plan", plan.status(), 5);
  auto local = (*d)->Dispatch(rows, *plan);
  if (!local.ok())
    return comm::testing::ReportFailure("dispatch", local.status(), 6);
  // Expected: local expert j, then source s, then place i.
  std::vector<float> want;
  const int64_t el = kExperts / kRanks;
  std::vector<int64_t> local_counts(el, 0);
  for (int64_t j = 0; j < el; ++j) {
    const int64_t e = me * el + j;
    for (int s = 0; s < kRanks; ++s) {
      local_counts[j] += Count(s, e);
      for (int64_t i = 0; i < Count(s, e); ++i) {
        for (int64_t c = 0; c < h; ++c)
          want.push_back(sign(c) * (Tag(s, e, i) + 0.25f * c));
      }
    }
  }
  if (plan->local_counts != local_counts || plan->rows != n ||
      local->ToFloats() !=
          Tensor::FromVector(want, {plan->local_rows, h}, dt)->ToFloats()) {
    std::fprintf(stderr, "rank %d: dispatched rows are not as expected\n", me);
    return 7;
  }
  auto back = (*d)->Combine(*local, *plan);
  if (!back.ok())
    return comm::testing::ReportFailure("combine", back.status(), 8);
  if (back->shape() != rows.shape() || back->ToFloats() != rows.ToFloats()) {
    std::fprintf(stderr, "rank %d: combined rows are not the sent ones\n", me);
    return 9;
  }
  return 0;
}

// (dispatcher, dtype)
class TokenDispatcherTest
    : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(TokenDispatcherTest, RowsArriveGroupedAndReturn) {
  auto results = comm::testing::RunWorkers(
      kRanks, "dispatch", absl::Seconds(60), [&](int) {
        return std::map<std::string, std::string>{
            {"MOE_DISPATCHER", GetParam().first},
            {"MOE_DTYPE", GetParam().second}};
      });
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, TokenDispatcherTest,
                         ::testing::Values(std::make_pair("alltoall", "fp32"),
                                           std::make_pair("allgather", "fp32"),
                                           std::make_pair("alltoall", "bf16"),
                                           std::make_pair("allgather",
                                                          "bf16")));

TEST(TokenDispatcherNamesTest, UnknownTypeIsRefused) {
  auto bad = ParseTokenDispatcherType("flex");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'flex'"), std::string::npos);
}

}  // namespace
}  // namespace moe
}  // namespace mcc
