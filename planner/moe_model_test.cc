#include "planner/moe_model.h"

#include <memory>
#include <set>
#include <vector>

#include "core/allocator.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "planner/device_spec.h"
#include "planner/layout_search.h"
#include "planner/memory_model.h"
#include "planner/param_count.h"
#include "planner/step_time_model.h"

namespace mcc {
namespace planner {
namespace {

// h 64, 4 heads, 4 layers (MoE on layers 1-3), 8 experts of ffn 32, top-2,
// a shared expert of 48, SwiGLU, vocabulary 128, sequence 32.
gpt::GPTConfig MoeModel() {
  gpt::GPTConfig c;
  c.num_layers = 4;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 128;
  c.seq_length = 32;
  c.add_bias_linear = false;
  c.normalization = gpt::Normalization::kRMSNorm;
  c.activation = gpt::Activation::kSwiGLU;
  c.num_experts = 8;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 32;
  c.moe_layer_freq = "([0]+[1]*3)";
  c.moe_shared_expert_intermediate_size = 48;
  c.moe_aux_loss_coeff = 1e-2;
  c.moe_z_loss_coeff = 1e-3;
  return c;
}

JobSpec MoeJob(int world) {
  JobSpec job;
  job.model = MoeModel();
  job.global_batch = 8;
  job.cluster.devices_per_node = world;
  return job;
}

int64_t Numel(const ParameterList& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p->value.numel();
  return n;
}

TEST(MoeModelTest, LayersFollowThePattern) {
  const gpt::GPTConfig c = MoeModel();
  EXPECT_EQ(MoeLayersIn(c, 0, 4), 3);
  Layout l;
  l.pp = 2;
  EXPECT_EQ(MoeLayersOnStage(c, l, 0), 1);
  EXPECT_EQ(MoeLayersOnStage(c, l, 1), 2);
  EXPECT_EQ(MostMoeLayersOnAStage(c, l), 2);
  l.virtual_stages = 2;  // chunks: layers 0, 2 on stage 0; 1, 3 on stage 1
  EXPECT_EQ(MoeLayersOnStage(c, l, 0), 1);
  EXPECT_EQ(MoeLayersOnStage(c, l, 1), 2);
  gpt::GPTConfig dense = c;
  dense.num_experts = 0;
  EXPECT_EQ(MoeLayersIn(dense, 0, 4), 0);
  EXPECT_EQ(MoeParamsPerRank(dense, 1, 1, 1).delta(), 0);
}

// The parameter count is the built model's: every expert, the router and
// the shared expert in place of the dense MLP on the MoE layers.
TEST(MoeModelTest, ParamsMatchTheBuiltModel) {
  const gpt::GPTConfig c = MoeModel();
  parallel::LayerContext ctx;
  auto model = gpt::GPTModel::Create(c, ctx);
  ASSERT_TRUE(model.ok()) << model.status();
  JobSpec job = MoeJob(1);
  Layout l;
  EXPECT_EQ(Numel((*model)->parameters()),
            StageParams(c, 1, 1, 0, 4) + MoeParamsOnStage(job, l, 0).delta);
  EXPECT_EQ(Numel((*model)->parameters()), ModelParams(c));
  // By hand: E h router, E (2 x 32 + 32) h experts, (2 x 48 + 48) h shared
  // in place of (2 x 256 + 256) h.
  const MoeLayerParams p = MoeParamsPerRank(c, 1, 1, 1);
  EXPECT_EQ(p.router, 8 * 64);
  EXPECT_EQ(p.experts, 8 * 96 * 64);
  EXPECT_EQ(p.shared, 144 * 64);
  EXPECT_EQ(p.dense_mlp, 768 * 64);
  // EP 4 holds 2 experts; ETP 2 half of each.
  EXPECT_EQ(MoeParamsPerRank(c, 1, 4, 2).experts, 2 * 96 * 64 / 2);
}

// What a forward leaves for its backward, measured on the allocator of a
// real serial MoE model, against the predicted record (fp32 and bf16,
// dropless: every slot computed, exact; with a capacity factor the
// prediction is the bound, the measurement at most it and within 10%).
TEST(MoeModelTest, RecordBytesMatchTheAllocator) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (double capacity : {0.0, 1.5}) {
      SCOPED_TRACE(testing::Message()
                   << DTypeName(dtype) << " capacity " << capacity);
      JobSpec job = MoeJob(1);
      job.dtype = dtype;
      job.model.moe_expert_capacity_factor = capacity;
      const gpt::GPTConfig& c = job.model;
      parallel::LayerContext ctx;
      ctx.dtype = dtype;
      auto model = gpt::GPTModel::Create(c, ctx);
      ASSERT_TRUE(model.ok()) << model.status();
      const int64_t b = 2;
      auto batches = std::make_shared<std::vector<gpt::MicroBatch>>(1);
      Tensor tokens = Tensor::Empty({b, c.seq_length}, DType::kInt64);
      for (int64_t i = 0; i < tokens.numel(); ++i) {
        tokens.data<int64_t>()[i] = (i * 37 + 11) % c.vocab_size;
      }
      (*batches)[0].tokens = tokens;
      (*batches)[0].labels = tokens;
      (*model)->SetMicroBatches(batches);
      Allocator* cpu = GetAllocator(Device::CPU());
      const int64_t before = cpu->Stats().current_bytes;
      auto out = (*model)->ForwardStep(0, Tensor(), /*backward_after=*/true);
      ASSERT_TRUE(out.ok()) << out.status();
      const int64_t held = cpu->Stats().current_bytes - before - 16;
      Layout l;
      l.micro_batch = b;
      const double predicted = ChunkRecordBytes(job, l, 4, true, true);
      if (capacity == 0) {
        EXPECT_EQ(held, predicted);
      } else {
        EXPECT_LE(held, predicted);
        EXPECT_GE(held, 0.9 * predicted);
      }
      // The dense model's record is smaller by the MoE layers' difference.
      JobSpec dense = job;
      dense.model.num_experts = 0;
      const MoeLayerWork w = MoeWork(job, l);
      EXPECT_DOUBLE_EQ(predicted - ChunkRecordBytes(dense, l, 4, true, true),
                       3 * (w.record_bytes - w.dense_record_bytes));
    }
  }
}

// Experts' gradients and optimizer state are sharded over the expert-data-
// parallel ranks, world / (ETP x EP x PP), the rest over DP x CP.
TEST(MoeModelTest, ExpertStateShardsOverExpertDataParallel) {
  JobSpec job = MoeJob(8);
  Layout l;
  l.tp = 2;
  l.dp = 4;
  l.ep = 2;
  l.etp = 1;
  l.zero = ZeroStage::kOptimizer;
  EXPECT_EQ(ExpertTensorParallel(l), 1);
  EXPECT_EQ(ExpertDataParallel(l), 4);  // 8 / (1 x 2 x 1)
  ASSERT_TRUE(CheckLayout(job, l).ok()) << CheckLayout(job, l);
  const MoeStageParams moe = MoeParamsOnStage(job, l, 0);
  EXPECT_EQ(moe.experts, 3 * 4 * 96 * 64);  // 4 whole experts a layer
  const MemoryBreakdown m = EstimateStageMemory(job, l, 0);
  const double P = static_cast<double>(m.params);
  EXPECT_EQ(m.params, StageParams(job.model, 2, 1, 0, 4) + moe.delta);
  EXPECT_DOUBLE_EQ(m.optimizer_state,
                   8 * ((P - moe.experts) / 4 + moe.experts / 4.0));
  l.etp = 0;  // ETP = TP 2: half as many expert data-parallel ranks
  EXPECT_EQ(ExpertDataParallel(l), 2);
  const MoeStageParams split = MoeParamsOnStage(job, l, 0);
  EXPECT_EQ(split.experts, moe.experts / 2);
  const MemoryBreakdown m2 = EstimateStageMemory(job, l, 0);
  const double P2 = static_cast<double>(m2.params);
  EXPECT_DOUBLE_EQ(m2.optimizer_state,
                   8 * ((P2 - split.experts) / 4 + split.experts / 2.0));
  // ZeRO-2/3 (train shards each unit's expert weights over expert DP too):
  // at TP 1, DP 8, EP 2 the experts' main copy and gradient shards over
  // EDP 4, the rest over DP 8.
  Layout z3;
  z3.dp = 8;
  z3.ep = 2;
  z3.etp = 1;
  z3.zero = ZeroStage::kParameters;
  ASSERT_TRUE(CheckLayout(job, z3).ok()) << CheckLayout(job, z3);
  EXPECT_EQ(ExpertDataParallel(z3), 4);
  const MoeStageParams moe3 = MoeParamsOnStage(job, z3, 0);
  const MemoryBreakdown m3 = EstimateStageMemory(job, z3, 0);
  const double Ps3 =
      (static_cast<double>(m3.params) - moe3.experts) / 8 + moe3.experts / 4.0;
  EXPECT_DOUBLE_EQ(m3.optimizer_state, 8 * Ps3);
  EXPECT_DOUBLE_EQ(m3.main_weights, 4 * Ps3);
  // HSDP: 2 instances, each holding the whole state once (dense over 4
  // ranks, experts over 2); 3 instances do not divide DP 8.
  z3.instances = 2;
  ASSERT_TRUE(CheckLayout(job, z3).ok()) << CheckLayout(job, z3);
  const MemoryBreakdown h = EstimateStageMemory(job, z3, 0);
  EXPECT_DOUBLE_EQ(h.optimizer_state,
                   8 * ((static_cast<double>(h.params) - moe3.experts) / 4 +
                        moe3.experts / 2.0));
  z3.ep = 4;
  z3.instances = 4;  // EDP 2: the experts' state cannot split in 4
  EXPECT_NE(CheckLayout(job, z3).message().find("do not divide expert DP 2"),
            absl::string_view::npos)
      << CheckLayout(job, z3);
}

TEST(MoeModelTest, ImbalanceIsBoundedOrStated) {
  JobSpec job = MoeJob(4);
  Layout l;
  l.dp = 4;
  l.micro_batch = 2;  // 64 tokens, 128 slots, 16 per expert on average
  EXPECT_EQ(MoeImbalance(job, l), 1);  // EP 1: one rank computes them all
  l.ep = 4;
  EXPECT_EQ(MoeImbalance(job, l), job.moe_dropless_imbalance);
  job.moe_dropless_imbalance = 9;  // never above EP
  EXPECT_EQ(MoeImbalance(job, l), 4);
  job.model.moe_expert_capacity_factor = 1.25;  // capacity 20 of 16
  EXPECT_DOUBLE_EQ(MoeImbalance(job, l), 8 * 20 / 128.0);
  l.ep = 1;
  job.model.moe_expert_capacity_factor = 0.5;  // 8 kept of 16 per expert
  EXPECT_DOUBLE_EQ(MoeImbalance(job, l), 0.5);
  EXPECT_NE(DescribeMoe(job, l).find("capacity factor 0.5"), std::string::npos)
      << DescribeMoe(job, l);
}

// The step: active experts' FLOPs (top-k, not every expert), the all-to-
// alls only under EP, priced by the comm model.
TEST(MoeModelTest, StepTimeCountsActiveExpertsAndAllToAll) {
  JobSpec job = MoeJob(4);
  job.model.seq_length = 256;
  job.cluster.device = *ShippedDevice("h100");
  job.cluster.device.intra_node_bandwidth = 1e9;
  job.cluster.device.subgroup_latency = 0;
  job.cluster.device.intra_node_latency = 1e-5;
  Layout l;
  l.dp = 4;
  l.micro_batch = 2;
  const StepTime ep1 = EstimateStepTime(job, l);
  EXPECT_EQ(ep1.ep_comm, 0);
  JobSpec top1 = job;
  top1.model.moe_router_topk = 1;
  EXPECT_LT(EstimateStepTime(top1, l).gemm, ep1.gemm);
  JobSpec more = job;  // Twice the experts, the same active FLOPs
  more.model.num_experts = 16;
  const StepTime st16 = EstimateStepTime(more, l);
  EXPECT_GT(st16.gemm, ep1.gemm);  // only the router and fewer rows each
  EXPECT_LT(st16.gemm, 1.25 * ep1.gemm);
  l.ep = 2;
  const StepTime ep2 = EstimateStepTime(job, l);
  // 4 all-to-alls a layer and micro-batch, 3 MoE layers, 1 micro-batch of
  // 512 tokens x 2 slots x 1.2 imbalance received, half from the other
  // rank, fp32, one message each.
  const DeviceSpec& d = job.cluster.device;
  const double bytes = 512 * 2 * 1.2 * 64 * 4 / 2.0;
  EXPECT_DOUBLE_EQ(ep2.ep_comm,
                   4 * 3 * (bytes / (1e9 * d.link_efficiency) + 1e-5));
  EXPECT_GT(ep2.total(), ep1.total() - ep1.ep_comm);
}

// The search tries every EP dividing the experts and the ranks (ETP 1, SP
// beside TP as for dense layers); EP > 1 runs beside TP under SP and under
// ZeRO-2/3 (expert weights sharded over expert DP).
TEST(MoeModelTest, SearchTriesExpertParallelism) {
  JobSpec job = MoeJob(4);
  job.cluster.device = *ShippedDevice("h100");
  SearchOptions options;
  options.include_unsupported = true;
  options.micro_batches = {1};
  std::set<int> eps;
  bool ep_zero3_runs = false;
  for (const Prediction& p : SearchLayouts(job, options)) {
    eps.insert(p.layout.ep);
    ep_zero3_runs |= p.layout.ep > 1 &&
                     p.layout.zero == ZeroStage::kParameters &&
                     p.unsupported.empty();
    EXPECT_EQ(p.layout.sequence_parallel, p.layout.tp > 1) << p.layout.Name();
    EXPECT_EQ(p.layout.etp, 1) << p.layout.Name();
    // ZB-V runs over gloo only: refused on the H100.
    const bool refused =
        (p.layout.ep > 1 && p.layout.tp > 1 && !p.layout.sequence_parallel) ||
        p.layout.schedule == PipelineSchedule::kZeroBubbleV;
    EXPECT_EQ(refused, !p.unsupported.empty()) << p.layout.Name();
  }
  EXPECT_TRUE(ep_zero3_runs);
  EXPECT_EQ(eps, (std::set<int>{1, 2, 4}));
  EXPECT_EQ(ExpertParallelSizes(job.model, 8), (std::vector<int>{1, 2, 4, 8}));
  gpt::GPTConfig dense = job.model;
  dense.num_experts = 0;
  EXPECT_EQ(ExpertParallelSizes(dense, 8), (std::vector<int>{1}));
}

TEST(MoeModelTest, LayoutsThatDoNotDivideAreRefusedByName) {
  JobSpec job = MoeJob(4);
  Layout l;
  l.dp = 4;
  l.ep = 3;
  job.cluster.devices_per_node = 4;
  auto s = CheckLayout(job, l);
  EXPECT_NE(s.message().find("EP 3 does not divide the 8 experts"),
            std::string::npos)
      << s;
  l.ep = 8;
  s = CheckLayout(job, l);
  EXPECT_NE(s.message().find("ETP x EP = 8"), std::string::npos) << s;
  job.model.num_experts = 0;
  l.ep = 2;
  s = CheckLayout(job, l);
  EXPECT_NE(s.message().find("needs a mixture of experts"), std::string::npos)
      << s;
}

}  // namespace
}  // namespace planner
}  // namespace mcc
