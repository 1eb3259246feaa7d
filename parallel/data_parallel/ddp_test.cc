// DistributedDataParallel: bucket layout and grad views, gradients equal to
// the serial accumulation, no communication before the last micro-batch,
// reductions launched while backward still runs, shards that cover every
// parameter once, and the weight-hash check naming what differs.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/weight_hash.h"

namespace mcc {
namespace data_parallel {
namespace {

gpt::GPTConfig Config(int layers = 2) {
  gpt::GPTConfig c;
  c.num_layers = layers;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 128;
  c.seq_length = 16;
  c.seed = 7;
  return c;
}

gpt::MicroBatch Batch(const gpt::GPTConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> tokens(2 * c.seq_length), labels(tokens.size());
  for (auto& t : tokens) t = rng() % c.vocab_size;
  for (auto& l : labels) l = rng() % c.vocab_size;
  gpt::MicroBatch b;
  b.tokens = *Tensor::FromInts(tokens, {2, c.seq_length});
  b.labels = *Tensor::FromInts(labels, {2, c.seq_length});
  return b;
}

std::unique_ptr<gpt::GPTModel> Model(int layers = 2) {
  return *gpt::GPTModel::Create(Config(layers), parallel::LayerContext());
}

TEST(DdpTest, BucketsHoldGradientViewsInReverseOrder) {
  auto model = Model();
  const ParameterList params = model->parameters();
  DdpConfig cfg;
  cfg.bucket_size_bytes = 64 * 1024;
  auto ddp = DistributedDataParallel::Create(params, nullptr, cfg);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  const auto& buckets = (*ddp)->buckets();
  ASSERT_GT(buckets.size(), 2u);
  // Reverse parameter order across and within buckets.
  std::vector<Parameter*> order;
  for (const Bucket& b : buckets) {
    const FlatLayout& l = b.layout;
    EXPECT_EQ(l.padded_numel % 16, 0);
    EXPECT_GE(l.padded_numel, l.numel);
    int64_t end = 0;
    for (size_t i = 0; i < l.params.size(); ++i) {
      Parameter* p = l.params[i].get();
      EXPECT_GE(l.offsets[i], end);
      EXPECT_EQ(l.offsets[i] % 16, 0);
      end = l.offsets[i] + p->value.numel();
      order.push_back(p);
      // main_grad is a zero-copy view of the bucket, shaped as the value.
      EXPECT_TRUE(p->main_grad.SharesStorageWith(b.grad_data));
      EXPECT_EQ(p->main_grad.shape(), p->value.shape());
      EXPECT_EQ(p->main_grad.raw_data(),
                static_cast<float*>(b.grad_data.raw_data()) + l.offsets[i]);
    }
    EXPECT_LE(end, l.numel);
    // Without the distributed optimizer this rank updates every parameter
    // whole.
    EXPECT_EQ(b.local_pieces.size(), l.params.size());
  }
  ASSERT_EQ(order.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(order[i], params[params.size() - 1 - i].get());
  }
  // Backward accumulates into the buckets; the result equals a run without
  // DDP.
  model->AddGradReadyHook((*ddp)->GradReadyHook());
  ASSERT_TRUE(model->ForwardBackward(Batch(Config(), 1), 1.0f).ok());
  ASSERT_TRUE((*ddp)->FinishGradSync().ok());
  auto plain = Model();
  ASSERT_TRUE(plain->ForwardBackward(Batch(Config(), 1), 1.0f).ok());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i]->main_grad.ToFloats(),
              plain->parameters()[i]->main_grad.ToFloats())
        << params[i]->name;
  }
  (*ddp)->ZeroGrads();
  for (const auto& p : params) {
    for (float g : p->main_grad.ToFloats()) ASSERT_EQ(g, 0.0f) << p->name;
  }
}

// Setup moves the gradients into their buffer before it makes the
// distributed optimizer's parameter buffer, freeing each old tensor first:
// beyond the values and gradients already held it needs one buffer (and its
// padding), where it needed both buffers at once before (the setup peak of
// CP 4 ZeRO-1 on the bench preset).
TEST(DdpTest, SetupNeedsOneBufferBeyondTheParameters) {
  auto model = Model();
  const ParameterList params = model->parameters();
  int64_t bytes = 0;
  for (const auto& p : params) {
    if (!p->main_grad.defined()) {
      p->main_grad = Tensor::Zeros(p->value.shape(), DType::kFloat32);
    }
    bytes += p->value.nbytes();
  }
  Allocator* allocator = GetAllocator(Device::CPU());
  const int64_t before = allocator->Stats().current_bytes;
  allocator->ResetPeak();
  DdpConfig cfg;
  cfg.use_distributed_optimizer = true;
  auto ddp = DistributedDataParallel::Create(params, nullptr, cfg);
  ASSERT_TRUE(ddp.ok()) << ddp.status();
  const int64_t extra = allocator->Stats().peak_bytes - before;
  EXPECT_GE(extra, bytes);
  EXPECT_LE(extra, bytes + bytes / 10 + 64 * 1024)
      << "parameters " << bytes << " bytes";
}

TEST(DdpTest, UnknownOrRepeatedParameterIsAnError) {
  auto model = Model();
  auto ddp = *DistributedDataParallel::Create(model->parameters(), nullptr,
                                              DdpConfig());
  Parameter stranger;
  stranger.name = "stranger.weight";
  auto s = ddp->OnGradsReady({&stranger});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("stranger.weight"), std::string::npos);
  Parameter* p = model->parameters()[0].get();
  ASSERT_TRUE(ddp->OnGradsReady({p}).ok());
  s = ddp->OnGradsReady({p});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(p->name), std::string::npos);
  ParameterList twice = {model->parameters()[0], model->parameters()[0]};
  EXPECT_FALSE(DistributedDataParallel::Create(twice, nullptr, {}).ok());
}

absl::StatusOr<comm::World> Init() {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  return comm::InitWorldFromEnvironment(options);
}

#define WORKER_CHECK(cond)                                                    \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "check failed at line %d: %s\n", __LINE__, #cond); \
      return 10;                                                              \
    }                                                                         \
  } while (0)
#define WORKER_OK(expr)                                                       \
  do {                                                                        \
    absl::Status _s = (expr);                                                 \
    if (!_s.ok()) {                                                           \
      std::fprintf(stderr, "line %d: %s\n", __LINE__, _s.ToString().c_str()); \
      return 11;                                                              \
    }                                                                         \
  } while (0)

// Two micro-batches per rank with overlap: nothing is communicated during
// the first; during the second every bucket is launched from the hook,
// the first ones before backward ends; the averaged gradients equal the
// serial accumulation over all ranks' micro-batches.
MCC_WORKER(ddp_overlap) {
  auto world = Init();
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  comm::ProcessGroup* dp = world->group.get();
  const int n = dp->size(), r = dp->rank();
  const bool overlap = std::getenv("MCC_TEST_OVERLAP")[0] == '1';
  auto model = Model(4);
  DdpConfig cfg;
  cfg.bucket_size_bytes = 64 * 1024;
  cfg.overlap_grad_reduce = overlap;
  auto ddp = DistributedDataParallel::Create(model->parameters(), dp, cfg);
  WORKER_OK(ddp.status());
  model->AddGradReadyHook((*ddp)->GradReadyHook());
  const int nb = static_cast<int>((*ddp)->buckets().size());
  WORKER_CHECK(nb >= 3);
  const int64_t seq0 = dp->sequence_number();
  (*ddp)->set_is_last_microbatch(false);
  WORKER_OK(model->ForwardBackward(Batch(Config(4), 2 * r), 0.25f).status());
  WORKER_CHECK(dp->sequence_number() == seq0);  // No communication.
  // Align the ranks as the previous step's collectives would.
  WORKER_OK(dp->BarrierSync());
  const int64_t seq1 = dp->sequence_number();
  (*ddp)->set_is_last_microbatch(true);
  WORKER_OK(
      model->ForwardBackward(Batch(Config(4), 2 * r + 1), 0.25f).status());
  const absl::Time backward_end = absl::Now();
  WORKER_CHECK(dp->sequence_number() == seq1 + (overlap ? nb : 0));
  WORKER_OK((*ddp)->FinishGradSync());
  WORKER_CHECK(dp->sequence_number() == seq1 + nb);
  const GradSyncTrace& t = (*ddp)->last_trace();
  int done = 0;
  for (int b = 0; b < nb; ++b) {
    WORKER_CHECK(t.launched_in_backward[b] == overlap);
    if (overlap) WORKER_CHECK(t.launched[b] <= backward_end);
    done += t.done_when_all_ready[b];
  }
  if (overlap) {
    // The first bucket (output layer, final norm, last layers) starts
    // reducing while the earlier layers' backward still runs.
    WORKER_CHECK(t.launched[0] < t.all_grads_ready);
    std::printf(
        "rank %d: %d buckets; bucket 0 launched %.3f ms before backward "
        "ended; %d of %d reductions already complete when it ended\n",
        r, nb, absl::ToDoubleMilliseconds(t.all_grads_ready - t.launched[0]),
        done, nb);
  } else {
    WORKER_CHECK(t.launched[0] >= t.finish_called);
  }
  // Against the serial accumulation of all 2n micro-batches.
  auto serial = Model(4);
  for (int k = 0; k < 2 * n; ++k) {
    WORKER_OK(serial->ForwardBackward(Batch(Config(4), k), 0.25f / n).status());
  }
  for (size_t i = 0; i < serial->parameters().size(); ++i) {
    const auto a = model->parameters()[i]->main_grad.ToDoubles();
    const auto b = serial->parameters()[i]->main_grad.ToDoubles();
    double diff = 0, ref = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      diff += (a[j] - b[j]) * (a[j] - b[j]);
      ref += b[j] * b[j];
    }
    if (std::sqrt(diff) > 1e-5 * std::sqrt(ref) + 1e-12) {
      std::fprintf(stderr, "gradient of %s differs: %g vs norm %g\n",
                   serial->parameters()[i]->name.c_str(), std::sqrt(diff),
                   std::sqrt(ref));
      return 12;
    }
  }
  return 0;
}

class DdpOverlapTest : public ::testing::TestWithParam<std::tuple<int, bool>> {
};

TEST_P(DdpOverlapTest, ReducesDuringBackwardAndEqualsSerial) {
  const auto [world, overlap] = GetParam();
  auto results = comm::testing::RunWorkers(
      world, "ddp_overlap", absl::Seconds(60), [overlap = overlap](int) {
        return std::map<std::string, std::string>{
            {"MCC_TEST_OVERLAP", overlap ? "1" : "0"}};
      });
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
    std::printf("%s", r.output.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Dp, DdpOverlapTest,
                         ::testing::Values(std::make_tuple(2, true),
                                           std::make_tuple(2, false),
                                           std::make_tuple(3, true)));

// Under the distributed optimizer the ranks' shards cover every element of
// every parameter exactly once, and the gathered parameters are the
// owners' values.
MCC_WORKER(ddp_shards) {
  auto world = Init();
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  comm::ProcessGroup* dp = world->group.get();
  auto model = Model();
  DdpConfig cfg;
  cfg.bucket_size_bytes = 50000;
  cfg.use_distributed_optimizer = true;
  auto ddp = DistributedDataParallel::Create(model->parameters(), dp, cfg);
  WORKER_OK(ddp.status());
  int64_t total = 0;
  std::map<const Parameter*, int64_t> base;
  for (const auto& p : model->parameters()) {
    base[p.get()] = total;
    total += p->value.numel();
  }
  Tensor cover = Tensor::Zeros({total}, DType::kInt32);
  for (const Bucket& b : (*ddp)->buckets()) {
    for (const FlatPiece& s : b.local_pieces) {
      Parameter* param = b.layout.params[s.param].get();
      for (int64_t i = s.begin; i < s.end; ++i) {
        cover.data<int32_t>()[base[param] + i] += 1;
      }
      // Owners write their rank into their pieces of the parameters.
      Tensor flat = *param->value.Reshape({-1});
      for (int64_t i = s.begin; i < s.end; ++i) {
        flat.data<float>()[i] = static_cast<float>(dp->rank() + 1);
      }
    }
  }
  WORKER_OK(dp->AllReduceSync(&cover, comm::ReduceOp::kSum));
  for (int64_t i = 0; i < total; ++i)
    WORKER_CHECK(cover.data<int32_t>()[i] == 1);
  WORKER_OK((*ddp)->StartParamGather());
  WORKER_OK((*ddp)->FinishParamGather());
  // Every rank now holds the same parameters, each element from its owner.
  WORKER_OK(CheckWeightHashAcrossReplicas(model->parameters(), dp));
  for (const auto& p : model->parameters()) {
    for (float v : p->value.ToFloats()) {
      WORKER_CHECK(v >= 1 && v <= dp->size());
    }
  }
  return 0;
}

TEST(DdpShardTest, ShardsCoverEveryElementOnce) {
  for (int world : {2, 3}) {
    auto results =
        comm::testing::RunWorkers(world, "ddp_shards", absl::Seconds(60));
    for (const auto& r : results) {
      ASSERT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
    }
  }
}

// Replicas agree, then rank 1 changes one parameter: every rank gets an
// error naming it and the ranks on each side.
MCC_WORKER(weight_hash) {
  auto world = Init();
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  comm::ProcessGroup* dp = world->group.get();
  auto model = Model();
  WORKER_OK(CheckWeightHashAcrossReplicas(model->parameters(), dp));
  const auto& params = model->parameters();
  Parameter* victim = params[5].get();
  if (dp->rank() == 1) victim->value.data<float>()[3] += 1e-3f;
  // A later parameter differs everywhere too; the first one is named.
  if (dp->rank() == 1) params[7]->value.data<float>()[0] += 1.0f;
  absl::Status s = CheckWeightHashAcrossReplicas(params, dp);
  WORKER_CHECK(!s.ok());
  const std::string msg(s.message());
  std::printf("rank %d: %s\n", dp->rank(), msg.c_str());
  WORKER_CHECK(msg.find("'" + victim->name + "'") != std::string::npos);
  WORKER_CHECK(msg.find(params[7]->name) == std::string::npos);
  WORKER_CHECK(msg.find("data-parallel ranks {0, 2}") != std::string::npos);
  WORKER_CHECK(msg.find("data-parallel ranks {1}") != std::string::npos);
  return 0;
}

TEST(WeightHashTest, NamesFirstDifferingParameterAndRanks) {
  auto results = comm::testing::RunWorkers(3, "weight_hash", absl::Seconds(60));
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  std::printf("%s", results[0].output.c_str());
}

TEST(WeightHashTest, HashSeesEveryByte) {
  Tensor a = Tensor::Zeros({4}, DType::kBFloat16);
  const uint64_t h0 = HashTensorBytes(a);
  a.data<BFloat16>()[3] = FloatToBFloat16(1.0f);
  EXPECT_NE(HashTensorBytes(a), h0);
}

}  // namespace
}  // namespace data_parallel
}  // namespace mcc
