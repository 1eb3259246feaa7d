#include "parallel/parallel_state.h"

#include <cstdio>

#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/testing/test_device.h"
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
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
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

// With a device that is not the host (the test device), every group has a
// host twin (gloo on CPU tensors) and a device twin (gloo on the test
// device's): the named accessors give the device twin, GroupFor picks by a
// tensor's device from either twin, and each twin sums its own device's
// tensors over the layout's ranks.
MCC_WORKER(twins) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(30);
  const Device dev = Device::TestDevice();
  auto world = comm::InitWorldFromEnvironment(options, dev);
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 3;
  }
  if (world->group->device() != Device::CPU() ||
      world->device_group->device() != dev ||
      world->For(dev) != world->device_group.get() ||
      world->For(Device::CPU()) != world->group.get()) {
    return 4;
  }
  auto state =
      ParallelState::Create(world->group, {2, 1, 1}, world->device_group);
  if (!state.ok()) {
    std::fprintf(stderr, "%s\n", state.status().ToString().c_str());
    return 5;
  }
  const ParallelState& s = **state;
  const int rank = world->group->rank();
  const RankLayout& l = s.layout();
  struct Check {
    comm::ProcessGroup* group;
    std::vector<std::vector<int>> groups;
  } checks[] = {{s.world(), {{0, 1, 2, 3}}},
                {s.tensor(), l.TensorGroups()},
                {s.data(), l.DataGroups()},
                {s.model(), l.ModelGroups()}};
  for (const Check& c : checks) {
    const std::vector<int> expected = RankLayout::GroupOf(c.groups, rank);
    comm::ProcessGroup* host = s.GroupFor(c.group, Device::CPU());
    if (c.group->device() != dev || host == c.group ||
        host->device() != Device::CPU() || s.GroupFor(host, dev) != c.group ||
        s.GroupFor(c.group, dev) != c.group ||
        host->global_ranks() != expected ||
        c.group->global_ranks() != expected) {
      std::fprintf(stderr, "twins of %s wrong\n", c.group->name().c_str());
      return 6;
    }
    int64_t sum = 0;
    for (int r : expected) sum += r;
    Tensor t = Tensor::Full({1}, rank, DType::kInt64);
    if (!host->AllReduceSync(&t, comm::ReduceOp::kSum).ok()) return 7;
    if (t.data<int64_t>()[0] != sum) return 8;
    Tensor d = *Tensor::Full({1}, rank, DType::kInt64).To(dev);
    if (!c.group->AllReduceSync(&d, comm::ReduceOp::kSum).ok()) return 9;
    if (d.To(Device::CPU())->data<int64_t>()[0] != sum) return 10;
    // The wrong twin refuses the tensor.
    if (host->AllReduceSync(&d, comm::ReduceOp::kSum).ok()) return 11;
  }
  return 0;
}

// Experts' groups, 4 ranks, TP 2, EP 2, ETP 1 (EDP 2): each group holds the
// layout's ranks and sums over them; ETP 1 is a new group (the tensor group
// has two ranks), expert data ({0, 2}, {1, 3}) is the dense data group's
// ranks and so that very group.
MCC_WORKER(expert_groups) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(30);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  ParallelSizes sizes;
  sizes.tensor = 2;
  sizes.expert_model = 2;
  sizes.expert_tensor = 1;
  auto state = ParallelState::Create(world->group, sizes);
  if (!state.ok()) {
    return comm::testing::ReportFailure("state", state.status(), 4);
  }
  const ParallelState& s = **state;
  const int rank = world->group->rank();
  const RankLayout& l = s.layout();
  struct Check {
    comm::ProcessGroup* group;
    std::vector<std::vector<int>> groups;
  } checks[] = {{s.expert_model(), {{0, 1}, {2, 3}}},
                {s.expert_tensor(), {{0}, {1}, {2}, {3}}},
                {s.expert_tensor_model(), {{0, 1}, {2, 3}}},
                {s.expert_data(), {{0, 2}, {1, 3}}}};
  for (const Check& c : checks) {
    if (c.groups != [&] {
          if (c.group == s.expert_model()) return l.ExpertModelGroups();
          if (c.group == s.expert_tensor()) return l.ExpertTensorGroups();
          if (c.group == s.expert_data()) return l.ExpertDataGroups();
          return l.ExpertTensorModelGroups();
        }()) {
      std::fprintf(stderr, "layout of %s wrong\n", c.group->name().c_str());
      return 5;
    }
    const std::vector<int> expected = RankLayout::GroupOf(c.groups, rank);
    if (c.group->global_ranks() != expected) return 6;
    Tensor t = Tensor::Full({1}, rank, DType::kInt64);
    if (!c.group->AllReduceSync(&t, comm::ReduceOp::kSum).ok()) return 7;
    int64_t sum = 0;
    for (int r : expected) sum += r;
    if (t.data<int64_t>()[0] != sum) return 8;
  }
  if (s.expert_data() != s.data() || s.expert_tensor() == s.tensor()) {
    return 9;
  }
  if (s.expert_coordinates().ep != rank % 2) return 10;
  return 0;
}

TEST(ParallelStateTest, ExpertGroupsFourRanksTp2Ep2) {
  auto results =
      comm::testing::RunWorkers(4, "expert_groups", absl::Seconds(90));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
}

TEST(ParallelStateTest, HostAndDeviceTwinsOnTheTestDevice) {
  auto results = comm::testing::RunWorkers(4, "twins", absl::Seconds(90));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
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
