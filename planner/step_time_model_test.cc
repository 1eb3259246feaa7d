#include "planner/step_time_model.h"

#include <algorithm>

#include "gtest/gtest.h"
#include "planner/memory_model.h"
#include "planner/param_count.h"

namespace mcc {
namespace planner {
namespace {

JobSpec H100Job(int nodes, int64_t global_batch) {
  JobSpec job;
  job.model.num_layers = 8;
  job.model.hidden_size = 1024;
  job.model.num_attention_heads = 16;
  job.model.vocab_size = 32000;
  job.model.seq_length = 2048;
  job.dtype = DType::kBFloat16;
  job.global_batch = global_batch;
  job.cluster.device = *ShippedDevice("h100");
  job.cluster.devices_per_node = 8;
  job.cluster.nodes = nodes;
  return job;
}

// TP over `tp` devices with sequence parallelism.
Layout SequenceParallel(int tp) {
  Layout l;
  l.tp = tp;
  l.sequence_parallel = true;
  return l;
}

TEST(StepTimeModelTest, BubbleIsPipelineFillAndDrain) {
  JobSpec job = H100Job(1, 64);
  Layout l;
  l.pp = 4;
  l.dp = 2;
  const StepTime st = EstimateStepTime(job, l);
  // A stage's work without the output layer (only the last stage has it).
  const double work =
      st.gemm + st.attention + st.elementwise + st.recompute + st.tp_comm;
  ASSERT_GT(st.head, 0);
  // m = 64 / 2 = 32 micro-batches: (P - 1) / m of the work.
  EXPECT_NEAR(st.bubble / work, 3.0 / 32, 1e-12);
  l.virtual_stages = 2;
  EXPECT_NEAR(EstimateStepTime(job, l).bubble / work, 3.0 / 64, 1e-12);
}

// ZB-H1's table, walked with W as the weight-gradient GEMMs, idles less
// than 1F1B's: (P - 1)(F + B - W) against (P - 1)(F + B).
TEST(StepTimeModelTest, ZeroBubbleH1WalksItsTable) {
  JobSpec job = H100Job(1, 64);
  Layout l;
  l.pp = 4;
  l.dp = 2;
  const StepTime one = EstimateStepTime(job, l);
  l.schedule = PipelineSchedule::kZeroBubbleH1;
  const StepTime zb = EstimateStepTime(job, l);
  EXPECT_LT(zb.bubble, one.bubble);
  EXPECT_GT(zb.bubble, 0);
  EXPECT_DOUBLE_EQ(zb.gemm, one.gemm);
}

// An uneven split is walked with each stage's own time: moving layers off
// the last stage (which carries the output layer) shortens the step, and
// the slowest stage's layers are the reported compute.
TEST(StepTimeModelTest, UnevenSplitWalksEachStagesTime) {
  JobSpec job = H100Job(1, 64);
  job.model.num_layers = 16;
  job.model.vocab_size = 48000;  // An output layer of about 3 layers.
  Layout l;
  l.pp = 4;
  l.dp = 2;
  for (PipelineSchedule s :
       {PipelineSchedule::kOneFOneB, PipelineSchedule::kZeroBubbleH1}) {
    l.schedule = s;
    l.last_stage_layers = 0;
    const StepTime even = EstimateStepTime(job, l);
    ASSERT_GT(even.head_mb, 2.5 * even.layer_mb);
    ASSERT_LT(even.head_mb, 3.9 * even.layer_mb);
    l.last_stage_layers = 1;  // 5 | 5 | 5 | 1
    const StepTime uneven = EstimateStepTime(job, l);
    EXPECT_LT(uneven.total(), even.total());
    EXPECT_NEAR(uneven.gemm, even.gemm * 5 / 4, 1e-9 * even.gemm);
    EXPECT_EQ(uneven.head, 0);  // The slowest stage is a middle one.
    EXPECT_GT(uneven.bubble, 0);
  }
}

// Each rank of an uneven split reduces and updates its own stage's
// parameters: with a slow DP link, the first stage (5 layers and the
// embedding) finishes after the slowest-computing one (3 layers and a wide
// output layer), and the step is the first stage's.
TEST(StepTimeModelTest, UnevenSplitReducesEachStagesOwnParameters) {
  JobSpec job = H100Job(1, 64);
  job.model.vocab_size = 96000;  // An output layer of about 6 layers.
  job.overlap_grad_reduce = false;
  DeviceSpec& d = job.cluster.device;
  const double link = 1e9;  // bytes/s, no latency, no reduction figure
  d.intra_node_bandwidth = d.subgroup_bandwidth = link;
  d.reduce_bandwidth = d.subgroup_reduce_bandwidth = 0;
  d.intra_node_latency = d.subgroup_latency = 0;
  d.link_efficiency = 1;
  Layout l;
  l.pp = 2;
  l.dp = 2;
  l.first_stage_layers = 5;  // 5 | 3
  const StepTime st = EstimateStepTime(job, l);
  const double first = StageParams(job.model, 1, 2, 0, 5);
  const double last = StageParams(job.model, 1, 2, 1, 3);
  ASSERT_GT(first, 1.1 * last);
  // The last stage computes longer.
  const double per_layer = st.layer_mb;
  ASSERT_GT(st.head_mb, 2.5 * per_layer);
  // DP 2's all-reduce moves 2 x (1/2) of the 4-byte gradients.
  EXPECT_NEAR(st.dp_comm, 4 * first / link, 1e-9 * st.dp_comm);
  EXPECT_EQ(st.head, 0);
}

// ZB-V's even split is walked with each chunk's own time: stage 0 holds the
// output layer (its second chunk) and the embedding, runs every micro-batch
// back to back and reports (almost) no bubble; the compute is the even
// split's.
TEST(StepTimeModelTest, ZeroBubbleVChargesTheHeadToStageZero) {
  JobSpec job = H100Job(1, 64);
  Layout l;
  l.pp = 4;
  l.dp = 2;
  l.virtual_stages = 2;
  const StepTime interleaved = EstimateStepTime(job, l);
  l.schedule = PipelineSchedule::kZeroBubbleV;
  const StepTime zbv = EstimateStepTime(job, l);
  EXPECT_DOUBLE_EQ(zbv.gemm, interleaved.gemm);
  EXPECT_DOUBLE_EQ(zbv.head, interleaved.head);
  const double work = zbv.gemm + zbv.attention + zbv.elementwise + zbv.head;
  EXPECT_LT(zbv.bubble, 0.01 * work);
  EXPECT_LT(zbv.bubble, interleaved.bubble);
}

// HSDP: the reduce-scatter runs within an instance, and the shards'
// all-reduce across instances; the optimizer's shard is an instance's.
TEST(StepTimeModelTest, InstancesShardWithinAndReduceAcross) {
  JobSpec job = H100Job(2, 64);
  Layout l;
  l.dp = 16;
  l.zero = ZeroStage::kOptimizer;
  const StepTime one = EstimateStepTime(job, l);
  l.instances = 2;
  const StepTime two = EstimateStepTime(job, l);
  EXPECT_NEAR(two.optimizer, 2 * one.optimizer, 1e-12);
  EXPECT_NE(two.dp_comm, one.dp_comm);
  // 16-bit moments cost widening and rounding passes.
  job.exp_avg_bytes = job.exp_avg_sq_bytes = 2;
  EXPECT_GT(EstimateStepTime(job, l).optimizer, two.optimizer);
}

TEST(StepTimeModelTest, RecomputationAddsForwards) {
  JobSpec job = H100Job(1, 8);
  Layout l;
  l.dp = 8;
  const StepTime none = EstimateStepTime(job, l);
  EXPECT_EQ(none.recompute, 0);
  l.recompute = Recompute::kFull;
  const StepTime full = EstimateStepTime(job, l);
  EXPECT_NEAR(full.recompute,
              none.gemm / 3 + none.attention / 3.5 + none.elementwise / 3,
              1e-12 * none.total());
  l.recompute = Recompute::kSelective;
  EXPECT_NEAR(EstimateStepTime(job, l).recompute, none.attention / 3.5,
              1e-12 * none.total());
  // torchtitan's 'op' policy: half the GEMMs' forward and the
  // memory-bound ops again, not attention.
  l.recompute = Recompute::kSelectiveOps;
  EXPECT_NEAR(EstimateStepTime(job, l).recompute,
              none.gemm / 6 + none.elementwise / 3, 1e-12 * none.total());
}

TEST(StepTimeModelTest, OverlapHidesGradientReduction) {
  JobSpec job = H100Job(2, 16);
  Layout l;
  l.dp = 16;
  const StepTime plain = EstimateStepTime(job, l);
  job.overlap_grad_reduce = true;
  const StepTime overlapped = EstimateStepTime(job, l);
  EXPECT_GT(plain.dp_comm, 0);
  EXPECT_LT(overlapped.dp_comm, plain.dp_comm);
  EXPECT_NEAR(overlapped.dp_comm + overlapped.dp_comm_hidden,
              plain.dp_comm + plain.dp_comm_hidden, 1e-15);
  // Between nodes the same reduction takes longer than inside one.
  JobSpec one_node = H100Job(1, 16);
  Layout l8;
  l8.dp = 8;
  EXPECT_GT(plain.dp_comm, EstimateStepTime(one_node, l8).dp_comm);
}

// A device whose cores all compute (the CPU) hides nothing: the same
// communication is all exposed, and the step is longer by what was hidden.
TEST(StepTimeModelTest, NoOverlapWhereTransfersNeedTheComputeCores) {
  JobSpec job = H100Job(2, 16);
  job.overlap_grad_reduce = true;
  Layout l;
  l.dp = 16;
  const StepTime overlapped = EstimateStepTime(job, l);
  ASSERT_GT(overlapped.dp_comm_hidden, 0);
  job.cluster.device.comm_overlap = 0;
  const StepTime cpu_like = EstimateStepTime(job, l);
  EXPECT_EQ(cpu_like.dp_comm_hidden, 0);
  EXPECT_NEAR(cpu_like.dp_comm, overlapped.dp_comm + overlapped.dp_comm_hidden,
              1e-15);
  EXPECT_NEAR(cpu_like.total() - overlapped.total(), overlapped.dp_comm_hidden,
              1e-12);
}

// Ring attention's traffic as ring_attention.cc moves it: K and V CP - 1
// times forward and backward in the model's dtype, their gradients CP times
// in fp32; full recompute passes K and V once more. On a link with no
// latency and no overlap the ring's time is its bytes over the bandwidth.
TEST(StepTimeModelTest, ContextParallelRingMovesWhatRingAttentionSends) {
  JobSpec job = H100Job(1, 8);
  job.cluster.device.intra_node_latency = 0;
  job.cluster.device.subgroup_latency = 0;
  job.cluster.device.comm_overlap = 0;
  const DeviceSpec& d = job.cluster.device;
  const double bw = d.intra_node_bandwidth * d.link_efficiency;
  const gpt::GPTConfig& c = job.model;
  const double layers = c.num_layers;
  for (int cp : {2, 4, 8}) {
    Layout l;
    l.cp = cp;
    l.dp = 8 / cp;
    const int m = static_cast<int>(job.global_batch / l.dp);
    // K and V of this rank's T = S / CP tokens (micro-batch 1, no GQA).
    const double kv_elems = 2.0 * c.seq_length / cp * c.hidden_size;
    for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
      job.dtype = dtype;
      const double e = DTypeSize(dtype);
      const double bytes = kv_elems * (2 * (cp - 1) * e + cp * 4.0);
      EXPECT_NEAR(EstimateStepTime(job, l).cp_comm, m * layers * bytes / bw,
                  1e-9 * m * layers * bytes / bw)
          << "CP " << cp << " " << DTypeName(dtype);
      l.recompute = Recompute::kFull;
      const double again = kv_elems * (cp - 1) * e;
      EXPECT_NEAR(EstimateStepTime(job, l).cp_comm,
                  m * layers * (bytes + again) / bw,
                  1e-9 * m * layers * bytes / bw)
          << "CP " << cp << " " << DTypeName(dtype) << ", full recompute";
      l.recompute = Recompute::kNone;
    }
  }
}

// The CPU probe measures reducing collectives apart from gathers: they use
// reduce_bandwidth inside a node; gathers and the link's rate are unchanged.
TEST(StepTimeModelTest, ReducingCollectivesUseTheReduceBandwidth) {
  JobSpec job = H100Job(1, 8);
  job.cluster.device.comm_overlap = 0;  // Every transfer shows in the step.
  Layout dp;
  dp.dp = 8;
  Layout tp;
  tp.tp = 8;
  tp.sequence_parallel = true;
  const StepTime dp_link = EstimateStepTime(job, dp);
  const StepTime tp_link = EstimateStepTime(job, tp);
  // Half the link's rate for reductions: the all-reduce's bandwidth term
  // doubles; the latency term stays.
  job.cluster.device.reduce_bandwidth =
      job.cluster.device.intra_node_bandwidth / 2;
  const StepTime dp_slow = EstimateStepTime(job, dp);
  const StepTime tp_slow = EstimateStepTime(job, tp);
  const DeviceSpec& d = job.cluster.device;
  const double latency = 2.0 * 7 * d.intra_node_latency;
  EXPECT_NEAR(dp_slow.dp_comm - latency, 2 * (dp_link.dp_comm - latency),
              1e-9 * dp_link.dp_comm);
  // SP: a layer's 6 gathers keep the link's rate; its 4 reduce-scatters
  // and the embedding's and output layer's all-reduces pay their bandwidth
  // term twice.
  const double n = 8, rate = d.intra_node_bandwidth * d.link_efficiency;
  const double hidden_bytes = 1.0 * tp.micro_batch * 2048 * 1024 * 2;
  const double per_micro_batch = 8 * 4 * (n - 1) / n * hidden_bytes / rate +
                                 2 * 2 * (n - 1) / n * hidden_bytes / rate;
  // And once a step, the norms' and biases' gradients: 6 vectors of h a
  // layer and the final norm's 2, fp32.
  const double sp_grads = 4.0 * 1024 * (6 * 8 + 2);
  EXPECT_NEAR(tp_slow.tp_comm - tp_link.tp_comm,
              NumMicroBatches(job, tp) * per_micro_batch +
                  2 * (n - 1) / n * sp_grads / rate,
              1e-9 * tp_link.tp_comm);
  // Between nodes the link's rate holds.
  job.cluster.devices_per_node = 1;
  job.cluster.nodes = 8;
  const StepTime inter = EstimateStepTime(job, dp);
  job.cluster.device.reduce_bandwidth = 0;
  EXPECT_DOUBLE_EQ(inter.dp_comm, EstimateStepTime(job, dp).dp_comm);
}

// A group smaller than the node's ranks (TP 2 of 8) takes the subgroup
// figures where the device has them; the whole node's group keeps the node's.
TEST(StepTimeModelTest, SmallerGroupsUseTheSubgroupFigures) {
  JobSpec job = H100Job(1, 8);
  job.cluster.device.comm_overlap = 0;
  Layout tp2 = SequenceParallel(2);
  tp2.dp = 4;
  const Layout tp8 = SequenceParallel(8);
  const StepTime tp2_node = EstimateStepTime(job, tp2);
  const StepTime tp8_node = EstimateStepTime(job, tp8);
  DeviceSpec& d = job.cluster.device;
  d.subgroup_bandwidth = d.intra_node_bandwidth / 4;
  d.subgroup_reduce_bandwidth = d.intra_node_bandwidth / 4;
  d.subgroup_latency = d.intra_node_latency * 10;
  const StepTime tp2_sub = EstimateStepTime(job, tp2);
  EXPECT_DOUBLE_EQ(EstimateStepTime(job, tp8).tp_comm, tp8_node.tp_comm);
  // TP 2: per layer 6 gathers and 4 reduce-scatters of one ring step each,
  // plus two all-reduces of two steps, per micro-batch.
  const double bytes = 1.0 * tp2.micro_batch * 2048 * 1024 * 2;
  const double sp_grads = 4.0 * 1024 * (6 * 8 + 2);
  auto comm = [&](double bw, double lat) {
    return NumMicroBatches(job, tp2) *
               (8 * 10 * (bytes / 2 / bw + lat) + 2 * (bytes / bw + 2 * lat)) +
           sp_grads / bw + 2 * lat;
  };
  const double link = d.link_efficiency;
  EXPECT_NEAR(tp2_node.tp_comm,
              comm(d.intra_node_bandwidth * link, d.intra_node_latency),
              1e-9 * tp2_node.tp_comm);
  EXPECT_NEAR(tp2_sub.tp_comm,
              comm(d.subgroup_bandwidth * link, d.subgroup_latency),
              1e-9 * tp2_sub.tp_comm);
}

// gloo widens bf16 reductions to fp32: TP's reduce-scatters and all-reduces
// move twice the bytes; its gathers do not.
TEST(StepTimeModelTest, WidenedReductionsMoveFp32) {
  JobSpec job = H100Job(1, 8);
  job.cluster.device.comm_overlap = 0;
  const Layout tp = SequenceParallel(8);
  const StepTime native = EstimateStepTime(job, tp);
  job.cluster.device.reduces_16bit_in_fp32 = true;
  const StepTime widened = EstimateStepTime(job, tp);
  const DeviceSpec& d = job.cluster.device;
  const double n = 8, rate = d.intra_node_bandwidth * d.link_efficiency;
  const double hidden_bytes = 1.0 * tp.micro_batch * 2048 * 1024 * 2;
  // The extra bf16 bytes once more: 4 reduce-scatters a layer, 2 all-reduces.
  const double extra = 8 * 4 * (n - 1) / n * hidden_bytes / rate +
                       2 * 2 * (n - 1) / n * hidden_bytes / rate;
  EXPECT_NEAR(widened.tp_comm - native.tp_comm,
              NumMicroBatches(job, tp) * extra, 1e-9 * native.tp_comm);
  job.dtype = DType::kFloat32;
  const StepTime fp32_widened = EstimateStepTime(job, tp);
  job.cluster.device.reduces_16bit_in_fp32 = false;
  EXPECT_DOUBLE_EQ(fp32_widened.tp_comm, EstimateStepTime(job, tp).tp_comm);
}

// CPU kernels widen bf16 to fp32 and cost what fp32 does: the memory-bound
// ops (the layers' and the loss's passes) take twice the bf16 bytes' time,
// the same as an fp32 model's; the GEMMs and attention are unchanged.
TEST(StepTimeModelTest, WidenedElementwiseCostsWhatFp32Does) {
  JobSpec job = H100Job(1, 8);
  const Layout tp = SequenceParallel(8);
  const StepTime bf16 = EstimateStepTime(job, tp);
  job.cluster.device.elementwise_16bit_at_fp32_cost = true;
  const StepTime widened = EstimateStepTime(job, tp);
  ASSERT_GT(bf16.elementwise, 0);
  EXPECT_NEAR(widened.elementwise, 2 * bf16.elementwise,
              1e-12 * bf16.elementwise);
  EXPECT_DOUBLE_EQ(widened.gemm, bf16.gemm);
  EXPECT_DOUBLE_EQ(widened.attention, bf16.attention);
  // The loss's six passes over the logits (micro-batch x sequence x the
  // padded vocabulary / TP) move 2 more bytes an element.
  const double logits = 1.0 * tp.micro_batch * job.model.seq_length *
                        job.model.padded_vocab_size(tp.tp) / tp.tp;
  const double bw = job.cluster.device.memory_bandwidth;
  EXPECT_NEAR(widened.head - bf16.head,
              NumMicroBatches(job, tp) * 6 * logits * 2 / bw, 1e-9 * bf16.head);
  // An fp32 model is unaffected by the flag.
  job.dtype = DType::kFloat32;
  const StepTime fp32_widened = EstimateStepTime(job, tp);
  job.cluster.device.elementwise_16bit_at_fp32_cost = false;
  const StepTime fp32 = EstimateStepTime(job, tp);
  EXPECT_DOUBLE_EQ(fp32_widened.elementwise, fp32.elementwise);
  EXPECT_NEAR(fp32.elementwise, widened.elementwise, 1e-12 * fp32.elementwise);
}

// Eager PyTorch's Llama block: its memory-bound ops, kernel by kernel, on a
// small model whose bytes are counted here by hand (bf16, a = 2): RMSNorm
// 36 bytes an element (cast up 6, square 8, mean 4, scale 8, cast down 6,
// weight 4), residual adds 6, rotary 20 a query or key element, repeat_kv
// 2 (kv + h) a tensor, SwiGLU 10 an FFN element.
TEST(StepTimeModelTest, EagerElementwiseCountsEachKernel) {
  JobSpec job = H100Job(1, 8);
  gpt::GPTConfig& c = job.model;
  c.hidden_size = 1024;
  c.num_attention_heads = 16;
  c.num_query_groups = 4;  // kv = 4 x 64 = 256
  c.ffn_hidden_size = 2048;
  c.position_embedding = gpt::PositionEmbedding::kRope;
  c.normalization = gpt::Normalization::kRMSNorm;
  c.activation = gpt::Activation::kSwiGLU;
  Layout dp;
  dp.dp = 8;
  const StepTime fused = EstimateStepTime(job, dp);
  job.fused_elementwise = false;
  const StepTime eager = EstimateStepTime(job, dp);
  const double h = 1024, kv = 256, f = 2048;
  const double per_token =
      2 * 36 * h + 2 * 6 * h + 20 * (h + kv) + 2 * 2 * (kv + h) + 10 * f;
  const double tokens = 1.0 * dp.micro_batch * c.seq_length;
  const double per_layer_fwd =
      per_token * tokens / job.cluster.device.memory_bandwidth;
  // A forward and a backward of twice its passes, every layer and micro-batch.
  EXPECT_NEAR(eager.elementwise,
              NumMicroBatches(job, dp) * c.num_layers * 3 * per_layer_fwd,
              1e-9 * eager.elementwise);
  EXPECT_GT(eager.elementwise, 2 * fused.elementwise);
  EXPECT_DOUBLE_EQ(eager.gemm, fused.gemm);
  // Megatron-style selective recomputation keeps them; torchtitan's 'op'
  // policy recomputes them all.
  EXPECT_DOUBLE_EQ(eager.recompute, fused.recompute);
  dp.recompute = Recompute::kSelectiveOps;
  const StepTime eager_ops = EstimateStepTime(job, dp);
  job.fused_elementwise = true;
  const StepTime fused_ops = EstimateStepTime(job, dp);
  EXPECT_NEAR(
      eager_ops.recompute - fused_ops.recompute,
      NumMicroBatches(job, dp) * c.num_layers *
          (per_layer_fwd -
           fused.elementwise / (3.0 * NumMicroBatches(job, dp) * c.num_layers)),
      1e-9 * eager_ops.recompute);
}

// Ranks that outnumber the cores (a CPU probe's core_share < 1): the step
// is at least the node's compute spread over the cores plus the exposed
// collectives (the group waits together), while a pipeline bubble leaves the
// core to another stage and adds nothing beyond the shared compute.
TEST(StepTimeModelTest, SharedCoresAddCollectivesButAbsorbBubbles) {
  JobSpec job = H100Job(1, 8);
  job.cluster.device.comm_overlap = 0;
  const Layout tp = SequenceParallel(8);
  const StepTime own = EstimateStepTime(job, tp);
  ASSERT_EQ(own.core_wait, 0);
  ASSERT_GT(own.tp_comm, 0);
  job.cluster.device.core_share = 0.25;
  const StepTime shared = EstimateStepTime(job, tp);
  const double busy = own.gemm + own.attention + own.elementwise + own.head +
                      own.recompute + own.optimizer;
  EXPECT_NEAR(shared.total(), busy / 0.25 + own.tp_comm, 1e-12 * busy);

  Layout pp;
  pp.pp = 4;
  pp.dp = 2;
  job.cluster.device.core_share = 1;
  const StepTime pp_own = EstimateStepTime(job, pp);
  ASSERT_GT(pp_own.bubble, 0);
  job.cluster.device.core_share = 0.25;
  const StepTime pp_shared = EstimateStepTime(job, pp);
  const double pp_busy = pp_own.gemm + pp_own.attention + pp_own.elementwise +
                         pp_own.head / 4 + pp_own.recompute + pp_own.optimizer;
  EXPECT_NEAR(pp_shared.total(),
              std::max(pp_own.total(), pp_busy / 0.25 + pp_own.pp_comm +
                                           pp_own.dp_comm + pp_own.tp_comm),
              1e-12 * pp_busy);
  EXPECT_GT(pp_busy / 0.25, pp_own.bubble);  // The bubble is absorbed.
}

TEST(StepTimeModelTest, GemmEfficiencyFollowsTheRowCount) {
  DeviceSpec d;
  d.gemm_efficiency = 0.8;
  EXPECT_EQ(GemmEfficiencyAt(d, 7), 0.8);  // No row dependence given.
  d.gemm_rows = 1024;
  d.gemm_small_rows = 256;
  d.gemm_small_efficiency = 0.6;
  EXPECT_DOUBLE_EQ(GemmEfficiencyAt(d, 256), 0.6);
  EXPECT_DOUBLE_EQ(GemmEfficiencyAt(d, 512), 0.7);  // Halfway in log2.
  EXPECT_DOUBLE_EQ(GemmEfficiencyAt(d, 1024), 0.8);
  EXPECT_DOUBLE_EQ(GemmEfficiencyAt(d, 64), 0.6);  // Held beyond.
  EXPECT_DOUBLE_EQ(GemmEfficiencyAt(d, 8192), 0.8);
  // Fewer rows per GEMM, slower GEMMs: micro-batch 1 costs more than 2 for
  // the same tokens.
  JobSpec job = H100Job(1, 16);
  job.cluster.device.gemm_rows = 8192;
  job.cluster.device.gemm_small_rows = 1024;
  job.cluster.device.gemm_small_efficiency =
      job.cluster.device.gemm_efficiency / 2;
  Layout l;
  l.dp = 8;
  l.micro_batch = 1;
  const double mb1 = EstimateStepTime(job, l).gemm;
  l.micro_batch = 2;
  EXPECT_GT(mb1, EstimateStepTime(job, l).gemm);
}

// The model's GEMM shapes per TP degree scale the GEMMs' rate (not
// attention's, which was measured against the one shaped GEMM).
TEST(StepTimeModelTest, GemmMixFactorScalesTheTpDegreesGemms) {
  DeviceSpec d;
  EXPECT_EQ(GemmMixFactor(d, 2), 1);  // Nothing measured.
  d.gemm_mix_factor = {{1, 0.9}, {2, 0.8}, {4, 0.7}};
  EXPECT_EQ(GemmMixFactor(d, 1), 0.9);
  EXPECT_EQ(GemmMixFactor(d, 2), 0.8);
  EXPECT_EQ(GemmMixFactor(d, 8), 0.7);  // The largest degree measured.
  d.gemm_mix_factor = {{2, 0.8}};
  EXPECT_EQ(GemmMixFactor(d, 1), 0.8);  // Only larger degrees measured.

  JobSpec job = H100Job(1, 8);
  Layout l;
  l.tp = 2;
  l.dp = 4;
  const StepTime plain = EstimateStepTime(job, l);
  job.cluster.device.gemm_mix_factor = {{1, 1.0}, {2, 0.5}};
  const StepTime mixed = EstimateStepTime(job, l);
  EXPECT_NEAR(mixed.gemm, 2 * plain.gemm, 1e-12 * plain.gemm);
  EXPECT_EQ(mixed.attention, plain.attention);
  EXPECT_GT(mixed.head, plain.head);  // The output layer is GEMMs too.
  l.tp = 1;
  l.dp = 8;
  job.cluster.device.gemm_mix_factor = {};
  const StepTime tp1_plain = EstimateStepTime(job, l);
  job.cluster.device.gemm_mix_factor = {{1, 1.0}, {2, 0.5}};
  EXPECT_EQ(EstimateStepTime(job, l).gemm, tp1_plain.gemm);
}

// Each GEMM call's fixed cost (DeviceSpec::gemm_seconds_per_weight) is paid
// per micro-batch: three calls a linear (forward, input gradient, weight
// gradient) over this rank's share of the weights, and one more a linear
// under full recomputation.
TEST(StepTimeModelTest, GemmCallCostIsPaidPerMicroBatch) {
  JobSpec job = H100Job(1, 16);
  Layout l;
  l.tp = 2;
  l.dp = 4;
  l.micro_batch = 1;  // 16 / 4 = 4 micro-batches.
  auto with_cost = [&](double seconds_per_weight) {
    JobSpec j = job;
    j.cluster.device.gemm_seconds_per_weight = seconds_per_weight;
    return EstimateStepTime(j, l);
  };
  const double c = 1e-9, h = 1024, V = 32000, layers = 8;
  const double layer_weights = 12 * h * h;  // QKV 3h^2, projection, FFN 8h^2.
  StepTime plain = with_cost(0), costed = with_cost(c);
  EXPECT_NEAR(costed.gemm - plain.gemm, 4 * layers * 3 * c * layer_weights / 2,
              1e-9 * costed.gemm);
  EXPECT_NEAR(costed.head - plain.head, 4 * 3 * c * h * V / 2,
              1e-9 * costed.head);
  EXPECT_EQ(costed.attention, plain.attention);
  // The same tokens in half the micro-batches pay half of it.
  l.micro_batch = 2;
  plain = with_cost(0);
  costed = with_cost(c);
  EXPECT_NEAR(costed.gemm - plain.gemm, 2 * layers * 3 * c * layer_weights / 2,
              1e-9 * costed.gemm);
  l.recompute = Recompute::kFull;
  plain = with_cost(0);
  costed = with_cost(c);
  EXPECT_NEAR(costed.recompute - plain.recompute,
              2 * layers * c * layer_weights / 2, 1e-9 * costed.recompute);
}

// --tp-comm-overlap: each of a layer's 10 sequence-parallel collectives runs
// beside one GEMM in TP chunks, costing max(comm, gemm) + min / TP.
TEST(StepTimeModelTest, TpCommOverlapHidesCollectivesBehindGemms) {
  JobSpec job = H100Job(1, 8);
  Layout l;
  l.tp = 8;
  l.sequence_parallel = true;
  const StepTime plain = EstimateStepTime(job, l);
  job.overlap_tp_comm = true;
  const StepTime overlapped = EstimateStepTime(job, l);
  EXPECT_EQ(plain.tp_comm_hidden, 0);
  EXPECT_GT(overlapped.tp_comm_hidden, 0);
  EXPECT_LT(overlapped.tp_comm, plain.tp_comm);
  EXPECT_NEAR(overlapped.tp_comm + overlapped.tp_comm_hidden, plain.tp_comm,
              1e-12 * plain.tp_comm);
  // Every pair exposes at least one chunk: nothing is hidden for free.
  EXPECT_GT(overlapped.tp_comm, plain.tp_comm / l.tp / 10);
  // Without sequence parallelism (all-reduces) nothing is overlapped.
  l.sequence_parallel = false;
  EXPECT_EQ(EstimateStepTime(job, l).tp_comm_hidden, 0);
}

TEST(StepTimeModelTest, MfuIsBelowTheGemmEfficiency) {
  JobSpec job = H100Job(1, 8);
  Layout l;
  l.dp = 8;
  const StepTime st = EstimateStepTime(job, l);
  EXPECT_GT(st.mfu, 0.2);
  EXPECT_LT(st.mfu, job.cluster.device.gemm_efficiency);
  EXPECT_NEAR(st.tokens_per_second * st.total(), 8.0 * 2048, 1e-6);
}

}  // namespace
}  // namespace planner
}  // namespace mcc
