// Under sequence parallelism the norm and dropout regions hold 1/TP of the
// sequence per rank: their peak activation bytes (allocator statistics)
// fall by the tensor-parallel size, in real multi-process runs.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/ops/dropout.h"
#include "gtest/gtest.h"
#include "models/gpt/transformer_layer.h"
#include "parallel/mappings.h"

namespace mcc {
namespace gpt {
namespace {

constexpr int64_t kSeq = 64, kBatch = 2, kHidden = 128;

// Peak bytes allocated while the norm and the dropout of one layer's
// residual region run on this rank's part of the sequence.
int64_t RegionPeakBytes(comm::ProcessGroup* tp, bool sp) {
  GPTConfig c;
  c.hidden_size = kHidden;
  c.num_attention_heads = 4;
  c.seq_length = kSeq;
  c.hidden_dropout = 0.1;
  parallel::LayerContext ctx;
  ctx.tp_group = tp;
  ctx.sequence_parallel = sp;
  auto norm = Norm::Create("ln", c, ctx);
  if (!norm.ok()) return -1;
  Tensor full = Tensor::Full({kSeq * kBatch, kHidden}, 0.5, DType::kFloat32);
  auto x = parallel::ScatterToSequenceParallelRegion::Forward(sp ? tp : nullptr,
                                                              full);
  if (!x.ok()) return -1;
  Tensor local = x->Clone();
  full = Tensor();
  Allocator* cpu = GetAllocator(Device::CPU());
  const int64_t before = cpu->Stats().current_bytes;
  cpu->ResetPeak();
  {
    Norm::Activations act;
    auto y = (*norm)->Forward(local, &act);
    if (!y.ok()) return -1;
    Tensor dropped = Tensor::Empty(y->shape(), y->dtype());
    if (!ops::Dropout(*y, 0.1f, 7, 0, &dropped).ok()) return -1;
  }
  return cpu->Stats().peak_bytes - before;
}

MCC_WORKER(sp_memory) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(30);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  const int64_t without = RegionPeakBytes(world->group.get(), false);
  const int64_t with = RegionPeakBytes(world->group.get(), true);
  std::printf("tp %d: region peak %lld bytes without SP, %lld with SP\n",
              world->group->size(), static_cast<long long>(without),
              static_cast<long long>(with));
  if (without <= 0 || with <= 0) return 4;
  // Exactly 1/TP: every tensor of the region scales with the tokens held.
  return without == with * world->group->size() ? 0 : 5;
}

class SpMemoryTest : public ::testing::TestWithParam<int> {};

TEST_P(SpMemoryTest, NormAndDropoutRegionsShrinkByTp) {
  auto results =
      comm::testing::RunWorkers(GetParam(), "sp_memory", absl::Seconds(60));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, SpMemoryTest, ::testing::Values(2, 4));

}  // namespace
}  // namespace gpt
}  // namespace mcc
