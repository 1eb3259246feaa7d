#include "planner/step_time_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "models/gpt/model_flops.h"
#include "planner/memory_model.h"
#include "planner/moe_model.h"
#include "planner/param_count.h"
#include "planner/schedule_walk.h"
#include "planner/stage_layers.h"

namespace mcc {
namespace planner {
namespace {

// A link's time for `bytes` in `messages` sequential messages.
double LinkSeconds(double bytes, double messages, bool inter_node,
                   const DeviceSpec& d) {
  const double bw =
      (inter_node ? d.inter_node_bandwidth : d.intra_node_bandwidth) *
      d.link_efficiency;
  const double lat = inter_node ? d.inter_node_latency : d.intra_node_latency;
  return (bw > 0 ? bytes / bw : 0) + messages * lat;
}

// A reducing collective's time for `bytes` in `messages` steps: at the
// measured reduction rate inside a node where there is one.
double ReduceSeconds(double bytes, double messages, bool inter,
                     const DeviceSpec& d) {
  if (inter || d.reduce_bandwidth <= 0) {
    return LinkSeconds(bytes, messages, inter, d);
  }
  return bytes / (d.reduce_bandwidth * d.link_efficiency) +
         messages * d.intra_node_latency;
}

// Ring collectives over n ranks on `bytes` of data per rank.
double AllReduce(double bytes, int n, bool inter, const DeviceSpec& d) {
  if (n <= 1) return 0;
  return ReduceSeconds(2.0 * (n - 1) / n * bytes, 2.0 * (n - 1), inter, d);
}
double ReduceScatter(double bytes, int n, bool inter, const DeviceSpec& d) {
  if (n <= 1) return 0;
  return ReduceSeconds(1.0 * (n - 1) / n * bytes, n - 1.0, inter, d);
}
double GatherOrScatter(double bytes, int n, bool inter, const DeviceSpec& d) {
  if (n <= 1) return 0;
  return LinkSeconds(1.0 * (n - 1) / n * bytes, n - 1.0, inter, d);
}

// The link figures a group of `n` ranks inside a node sees: one smaller than
// the node's ranks takes the device's subgroup figures where it has them.
DeviceSpec ForGroup(const DeviceSpec& d, int n, int per_node) {
  if (n >= per_node || d.subgroup_latency <= 0) return d;
  DeviceSpec g = d;
  g.intra_node_bandwidth = d.subgroup_bandwidth;
  g.reduce_bandwidth = d.subgroup_reduce_bandwidth;
  g.intra_node_latency = d.subgroup_latency;
  return g;
}

// One layer's linear weights (TP 1): its GEMMs' multiply-adds per token.
double LayerWeights(const gpt::GPTConfig& c) {
  double w = 0;
  for (const LinearShape& l : LayerLinears(c)) {
    w += static_cast<double>(l.out) * static_cast<double>(l.in);
  }
  return w;
}

// The bytes one layer's memory-bound ops move in a micro-batch's forward
// under eager PyTorch, counted kernel by kernel from torchtitan's Llama block
// (torchtitan/models/llama/model.py and models/norms.py at 9dec370): `a`
// bytes an activation, fp32 (4 bytes) in between.
//  - RMSNorm, x * rsqrt(x.float().pow(2).mean(-1) + eps), cast back, times
//    the weight: cast up (a + 4), square (4 + 4), mean (4), scale (4 + 4),
//    cast down (4 + a), weight (a + a): 28 + 4a an element, twice a layer.
//  - The residual adds: 3a an element, twice.
//  - Rotary, through complex fp32: cast up (a + 4), multiply (4 + 4), cast
//    down (4 + a): 16 + 2a for each query and key element.
//  - Grouped-query attention's repeat_kv copies keys and values to every
//    query head: a kv read and a h written, each.
//  - SwiGLU, silu(w1 x) * w3 x: silu (2a), multiply (3a) per FFN element;
//    GeLU one kernel (2a).
// The attention output's transpose is free (flash attention writes it in
// that layout); the QKV projections are separate GEMMs, so nothing splits.
double EagerElementwiseBytes(const gpt::GPTConfig& c, double T, double Tl,
                             double t, double a) {
  const double h = static_cast<double>(c.hidden_size);
  const double kv = static_cast<double>(c.query_groups() * c.head_dim());
  const double f = static_cast<double>(c.ffn());
  const double norm =
      c.normalization == gpt::Normalization::kRMSNorm ? 28 + 4 * a : 2 * a;
  const double rotary =
      c.position_embedding == gpt::PositionEmbedding::kRope ? 16 + 2 * a : 0;
  const double repeat_kv = kv < h ? 2 * (a * kv + a * h) : 0;
  const double activation =
      c.activation == gpt::Activation::kSwiGLU ? 5 * a : 2 * a;
  return Tl * h * (2 * norm + 2 * 3 * a) +
         T / t * ((h + kv) * rotary + repeat_kv + f * activation);
}

// A layout whose stages differ (an uneven split, or ZB-V's V with the
// output layer on stage 0): the step its table takes with every (rank,
// chunk)'s own time, and one rank's place in it.
struct StageOfUnevenLayout {
  int stage = 0;
  int head_stage = 0;
  double busy_mb = 0;   // The stage's compute a micro-batch (its chunks').
  double makespan = 0;  // The table walked, every stage its own time.
};

// One stage's step: `layers` decoder layers, the output layer and loss
// when `head_here`. With `uneven`, the bubble is the walked step beyond
// this stage's busy time, and the DP reduction and the optimizer move this
// stage's own parameters; otherwise the bubble is the walk with every
// stage a head-less stage's time, and they move the even split's (the last
// stage's gradients, the first stage's state).
StepTime StageStepTime(const JobSpec& job, const Layout& l, double layers,
                       bool head_here, const StageOfUnevenLayout* uneven) {
  const gpt::GPTConfig& c = job.model;
  const DeviceSpec& dev = job.cluster.device;
  const int per_node = job.cluster.devices_per_node;
  const double e = static_cast<double>(DTypeSize(job.dtype));
  const double t = l.tp;
  const double T = static_cast<double>(l.micro_batch) * c.seq_length / l.cp;
  const double Tl = l.sequence_parallel ? T / t : T;
  const double h = static_cast<double>(c.hidden_size);
  const double kv = static_cast<double>(c.query_groups() * c.head_dim());
  const double f = static_cast<double>(c.ffn());
  const double f1 = c.activation == gpt::Activation::kSwiGLU ? 2 * f : f;
  const double V = static_cast<double>(c.padded_vocab_size(l.tp));
  const int m = NumMicroBatches(job, l);

  // Every GEMM of a micro-batch has T rows (the gathered sequence under
  // SP); the efficiency of that row count, and of the TP degree's shapes.
  const double shaped_rate =
      dev.PeakFlops(job.dtype) * GemmEfficiencyAt(dev, T);
  const double gemm_rate = shaped_rate * GemmMixFactor(dev, l.tp);
  // Attention's rate was measured against the one shaped GEMM's.
  const double attn_rate = shaped_rate * dev.attention_efficiency;
  const double bw = dev.memory_bandwidth;
  // Bytes an element of activations costs a memory-bound kernel.
  const double elem_bytes =
      dev.elementwise_16bit_at_fp32_cost ? std::max(e, 4.0) : e;

  // One GEMM call's time for `weights` weight elements (this rank's share):
  // its FLOPs on `rows` rows at the mix's rate, plus the fixed cost of its
  // weight-sized operand, which fewer rows amortize over less work.
  auto gemm_call = [&](double rows, double weights) {
    return 2 * rows * weights / gemm_rate +
           dev.gemm_seconds_per_weight * weights;
  };

  // One layer, one micro-batch, forward.
  const double gemm_fwd = gemm_call(T, LayerWeights(c) / t);
  // Causal flash attention: half of the 4 T s h / TP score and value FLOPs;
  // its backward is about 2.5 forwards (it recomputes the scores).
  const double attn_fwd = 0.5 * 4 * T * c.seq_length * h / t / attn_rate;
  // Norms, residual adds, the QKV split, the context transpose, the
  // activation: bytes read and written, each op one kernel.
  const double elem_fwd =
      (job.fused_elementwise
           ? elem_bytes * (14 * Tl * h + 2 * T * (h + 2 * kv) / t +
                           2 * T * h / t + T * (f1 + f) / t)
           : EagerElementwiseBytes(c, T, Tl, t, elem_bytes)) /
      bw;

  StepTime st;
  st.gemm = m * layers * 3 * gemm_fwd;
  st.attention = m * layers * 3.5 * attn_fwd;
  st.elementwise = m * layers * 3 * elem_fwd;
  if (l.recompute == Recompute::kFull) {
    st.recompute = m * layers * (gemm_fwd + attn_fwd + elem_fwd);
  } else if (l.recompute == Recompute::kSelective) {
    st.recompute = m * layers * attn_fwd;
  } else if (l.recompute == Recompute::kSelectiveOps) {
    // Every other matmul (half the GEMM FLOPs, taken evenly) and the
    // memory-bound ops again; attention is kept.
    st.recompute = m * layers * (gemm_fwd / 2 + elem_fwd);
  }
  // Mixture of experts (planner/moe_model.h), per MoE layer and micro-batch
  // forward: the router, the grouped GEMM over the busiest rank's expert
  // rows (at the rate of its rows per expert) and the shared expert in place
  // of the dense MLP's GEMMs; four all-to-alls (and ETP gathers) exposed,
  // six under full recomputation (the forward's again).
  const double moe_layers = MostMoeLayersOnAStage(c, l);
  double moe_mb = 0;
  if (moe_layers > 0) {
    const MoeLayerWork w = MoeWork(job, l);
    const int etp = ExpertTensorParallel(l);
    const double expert_rate = dev.PeakFlops(job.dtype) *
                               GemmEfficiencyAt(dev, w.rows_per_expert) *
                               GemmMixFactor(dev, etp);
    const double moe_gemm_fwd =
        2 * w.expert_rows * w.expert_weights / expert_rate +
        dev.gemm_seconds_per_weight * w.expert_weights * w.local_experts +
        (w.shared_weights > 0 ? gemm_call(T, w.shared_weights) : 0) +
        gemm_call(Tl, w.router_weights) - gemm_call(T, w.dense_mlp_weights);
    const double moe_elem_fwd = w.elementwise_bytes / bw;
    const double passes = l.recompute == Recompute::kFull ? 6 : 4;
    const bool ep_inter = etp * l.ep > per_node;
    double comm = 0;
    if (l.ep > 1) {
      comm += passes * LinkSeconds(w.all_to_all_bytes, l.ep - 1, ep_inter,
                                   ForGroup(dev, l.ep, per_node));
    }
    if (w.etp_bytes > 0) {
      comm += passes * GatherOrScatter(w.etp_bytes, etp, etp > per_node,
                                       ForGroup(dev, etp, per_node));
    }
    st.gemm += m * moe_layers * 3 * moe_gemm_fwd;
    st.elementwise += m * moe_layers * 3 * moe_elem_fwd;
    if (l.recompute == Recompute::kFull) {
      st.recompute += m * moe_layers * (moe_gemm_fwd + moe_elem_fwd);
    }
    moe_mb = moe_layers * comm;
    st.ep_comm = m * moe_mb;
  }

  // The last stage's head: output-layer GEMMs and cross entropy passes.
  const double head_mb =
      3 * gemm_call(T, h * V / t) + 6 * T * V / t * elem_bytes / bw;
  st.head = head_here ? m * head_mb : 0;

  // TP: per layer two collectives of the hidden states each way; sequence
  // parallelism re-gathers two inputs in the backward. Plus the embedding's
  // and the output layer's.
  const bool tp_inter = l.tp > per_node;
  const DeviceSpec tp_dev = ForGroup(dev, l.tp, per_node);
  const double hidden_bytes = T * h * e;
  // What a reduction of the hidden states moves (widened to fp32 by gloo).
  const double reduced_hidden_bytes =
      dev.reduces_16bit_in_fp32 ? T * h * std::max(e, 4.0) : hidden_bytes;
  double tp_mb = 0, tp_hidden_mb = 0;
  if (l.tp > 1) {
    const double per_layer =
        l.sequence_parallel
            ? 6 * GatherOrScatter(hidden_bytes, l.tp, tp_inter, tp_dev) +
                  4 * ReduceScatter(reduced_hidden_bytes, l.tp, tp_inter,
                                    tp_dev)
            : 4 * AllReduce(reduced_hidden_bytes, l.tp, tp_inter, tp_dev);
    double exposed = per_layer;
    if (job.overlap_tp_comm && l.sequence_parallel) {
      // Megatron's --tp-comm-overlap splits each all-gather (reduce-scatter)
      // into TP chunks and runs the GEMM that consumes (produces) them chunk
      // by chunk, so a pair costs max(comm, gemm) plus one chunk of the
      // smaller. The pairs: forward, the gathers before QKV and FC1 and the
      // scatters after the projection and FC2; backward, the gathers of
      // QKV's and FC1's inputs (beside their input-gradient GEMMs), the
      // scatters of their input gradients (beside the weight-gradient
      // GEMMs), and the gathers of the projection's and FC2's output
      // gradients (beside their input-gradient GEMMs).
      const std::array<LinearShape, 4> linears = LayerLinears(c);
      auto weights = [&](LayerLinear which) {
        return static_cast<double>(linears[which].out) * linears[which].in;
      };
      const double qkv = weights(kQkv), proj = weights(kProjection),
                   fc1 = weights(kFc1), fc2 = weights(kFc2);
      const double comm = GatherOrScatter(hidden_bytes, l.tp, tp_inter, tp_dev);
      exposed = 0;
      for (double w : {qkv, proj, fc1, fc2, qkv, qkv, fc1, fc1, proj, fc2}) {
        const double gemm = gemm_call(T, w / t);
        exposed += std::max(comm, gemm) + std::min(comm, gemm) / l.tp - gemm;
      }
    }
    exposed = per_layer - dev.comm_overlap * (per_layer - exposed);
    tp_mb = layers * exposed +
            2 * AllReduce(reduced_hidden_bytes, l.tp, tp_inter, tp_dev);
    tp_hidden_mb = layers * (per_layer - exposed);
  }
  st.tp_comm = m * tp_mb;
  st.tp_comm_hidden = m * tp_hidden_mb;
  if (l.tp > 1 && l.sequence_parallel) {
    // Once a step: the norms' and row-parallel biases' fp32 gradients (about
    // six vectors of h a layer), summed over TP in one coalesced all-reduce.
    st.tp_comm += AllReduce(4 * h * (6 * layers + 2), l.tp, tp_inter, tp_dev);
  }

  // CP: ring attention (parallel/context_parallel/ring_attention.cc) passes
  // this rank's K and V on CP - 1 times in the forward and again in the
  // backward, and their gradients, in fp32 whatever the dtype, CP times (the
  // last takes them home); full recompute repeats the forward's ring. Each
  // pass is one exchange of the block with both neighbours, behind the
  // attention where the device overlaps them.
  if (l.cp > 1) {
    const bool cp_inter = l.tp * l.cp > per_node;
    const DeviceSpec cp_dev = ForGroup(dev, l.cp, per_node);
    const double kv_elems = 2 * T * kv / t;
    const double kv_passes =
        (l.recompute == Recompute::kFull ? 3.0 : 2.0) * (l.cp - 1);
    const double ring =
        layers * (kv_passes * LinkSeconds(kv_elems * e, 1, cp_inter, cp_dev) +
                  l.cp * LinkSeconds(kv_elems * 4, 1, cp_inter, cp_dev));
    const double hideable = 3.5 * attn_fwd * layers;
    st.cp_comm = m * (ring - dev.comm_overlap * std::min(ring, hideable));
    st.cp_comm_hidden = m * ring - st.cp_comm;
  }

  // Per micro-batch compute of this stage, forward and backward.
  const double compute_mb =
      (st.gemm + st.attention + st.elementwise + st.recompute + st.head) / m;
  const double fwd_mb = compute_mb / 3;
  const double bwd_mb = compute_mb - fwd_mb;
  // The fill and drain pass through the other stages, which have no output
  // layer: a stage's time without the head (the head sits on the last stage
  // alone; with it the bubble came out 23-25% high for PP 4 of the 8-layer
  // bench model, whose head is a third of a stage).
  const double stage_mb =
      compute_mb - st.head / m + tp_mb + st.cp_comm / m + moe_mb;
  st.layer_mb = (stage_mb - 2 * (l.tp > 1 ? AllReduce(reduced_hidden_bytes,
                                                      l.tp, tp_inter, tp_dev)
                                          : 0.0)) /
                std::max(layers, 1.0);
  st.head_mb = head_mb;
  if (LayoutSplitsBackward(job, l)) {
    st.layer_weight_mb = gemm_fwd;
    st.head_weight_mb = gemm_call(T, h * V / t);
  }
  // The lookup writes T x h, its gradient reads them and adds into the table.
  st.embedding_mb = 3 * T * h * elem_bytes / bw;

  // Whose parameters the DP reduction (and the experts' over EDP) and the
  // optimizer step move.
  const int grads_stage = uneven != nullptr ? uneven->stage : l.pp - 1;
  const int state_stage = uneven != nullptr ? uneven->stage : 0;
  const int head_stage = uneven != nullptr ? uneven->head_stage : -1;

  // DP: fp32 gradients (train reduces in fp32), parameters gathered in the
  // model dtype. Under HSDP the state is sharded within an instance of
  // DP x CP / instances ranks: gradients reduce-scatter within it, then the
  // shard all-reduces across the instances; parameters gather within it.
  const int shards = l.dp * l.cp;
  const int instances = std::max(1, l.instances);
  const int shards_in = shards / instances;
  if (shards > 1) {
    const bool dp_inter = l.tp * l.cp * l.dp > per_node;
    const bool in_inter = l.tp * shards_in > per_node;
    const DeviceSpec dp_dev = ForGroup(dev, shards, per_node);
    // Experts' gradients are reduced over EDP, below.
    const MoeStageParams moe = MoeParamsOnStage(job, l, grads_stage);
    const DeviceSpec in_dev = ForGroup(dev, shards_in, per_node);
    const DeviceSpec across_dev = ForGroup(dev, instances, per_node);
    const double P =
        static_cast<double>(StageParams(c, l.tp, l.pp, grads_stage,
                                        static_cast<int>(layers), head_stage) +
                            moe.delta - moe.experts);
    const double grads = 4 * P, params = e * P;
    // The sharded gradient reduction: within the instance, then across.
    const double sharded_reduce =
        ReduceScatter(grads, shards_in, in_inter, in_dev) +
        AllReduce(grads / shards_in, instances, dp_inter, across_dev);
    const double across =
        sharded_reduce - ReduceScatter(grads, shards_in, in_inter, in_dev);
    const double sharded_gather =
        GatherOrScatter(params, shards_in, in_inter, in_dev);
    double comm = 0, exposed = 0;
    switch (l.zero) {
      case ZeroStage::kNone:
      case ZeroStage::kOptimizer: {
        const double reduce = l.zero == ZeroStage::kNone
                                  ? AllReduce(grads, shards, dp_inter, dp_dev)
                                  : sharded_reduce;
        const double gather = l.zero == ZeroStage::kNone ? 0 : sharded_gather;
        const double buckets = std::max(
            1.0, std::ceil(grads / std::max<int64_t>(1, job.bucket_bytes)));
        comm = reduce + gather;
        exposed = job.overlap_grad_reduce
                      ? std::max(reduce - bwd_mb, reduce / buckets)
                      : reduce;
        exposed +=
            job.overlap_param_gather ? std::max(0.0, gather - fwd_mb) : gather;
        break;
      }
      case ZeroStage::kGradients:
      case ZeroStage::kParameters: {
        // Each micro-batch reduce-scatters its gradients as units finish
        // (behind the backward); ZeRO-3 also gathers every unit before its
        // forward and backward (prefetched behind the previous unit). The
        // cross-instance all-reduce runs once a step on the shards.
        const double rs = ReduceScatter(grads, shards_in, in_inter, in_dev);
        const double ag = sharded_gather;
        const double units = layers + 2;
        if (l.zero == ZeroStage::kGradients) {
          comm = m * rs + ag + across;
          exposed = m * std::max(0.0, rs - bwd_mb) + rs / units + ag + across;
        } else {
          comm = m * (rs + 2 * ag) + across;
          exposed =
              m * (std::max(0.0, rs - bwd_mb) + std::max(0.0, ag - fwd_mb) +
                   std::max(0.0, ag - bwd_mb)) +
              (rs + 2 * ag) / units + across;
        }
        break;
      }
    }
    exposed = std::min(comm, exposed);
    st.dp_comm = comm - dev.comm_overlap * (comm - exposed);
    st.dp_comm_hidden = comm - st.dp_comm;
  }

  // Experts' gradients: reduced (and their state sharded) over the expert-
  // data-parallel ranks, in the same way as the dense ones over DP x CP.
  const MoeStageParams moe_last = MoeParamsOnStage(job, l, grads_stage);
  const int edp = ExpertDataParallel(l);
  if (moe_last.experts > 0 && edp > 1) {
    const bool inter = l.world() / l.pp > per_node;
    const DeviceSpec edp_dev = ForGroup(dev, edp, per_node);
    const double X = static_cast<double>(moe_last.experts);
    const double rs = ReduceScatter(4 * X, edp, inter, edp_dev);
    const double ag = GatherOrScatter(e * X, edp, inter, edp_dev);
    double comm = 0;
    switch (l.zero) {
      case ZeroStage::kNone:
        comm = AllReduce(4 * X, edp, inter, edp_dev);
        break;
      case ZeroStage::kOptimizer:
        comm = rs + ag;
        break;
      case ZeroStage::kGradients:
        comm = m * rs + ag;
        break;
      case ZeroStage::kParameters:
        comm = m * (rs + 2 * ag);
        break;
    }
    const double exposed =
        job.overlap_grad_reduce ? std::max(0.0, comm - m * bwd_mb) : comm;
    const double shown = comm - dev.comm_overlap * (comm - exposed);
    st.dp_comm += shown;
    st.dp_comm_hidden += comm - shown;
  }

  // PP: each chunk sends its output forward and receives a gradient back,
  // per micro-batch; overlapped, only the fill and drain are exposed.
  if (l.pp > 1) {
    const bool pp_inter = l.world() > per_node;
    // Each send is between two stages while the others compute.
    const double msg =
        LinkSeconds(Tl * h * e, 1, pp_inter, ForGroup(dev, 2, per_node));
    const double all = 2.0 * m * l.virtual_stages * msg;
    const double exposed =
        job.overlap_p2p ? std::min(all, 2.0 * (l.pp - 1) * msg) : all;
    st.pp_comm = all - dev.comm_overlap * (all - exposed);
    st.pp_comm_hidden = all - st.pp_comm;
    // The fill and drain: the executor's table for this layout, run with
    // every stage taking the head-less stage's time (a third forward, two
    // thirds backward; a split backward's W is the weight-gradient GEMMs,
    // a third of the GEMMs), less the busy time of a stage.
    // Beyond 2^16 (rank, chunk, micro-batch) cells (a search over large
    // clusters) the closed forms stand in: 1F1B's and interleaving's
    // (P - 1) / chunks of a stage's time, which their tables give exactly
    // (schedule_walk_test), and the zero-bubble paper's (P - 1)(F + B - W).
    const double v = l.virtual_stages;
    const double w = LayoutSplitsBackward(job, l) ? layers / v * gemm_fwd : 0;
    const double f_chunk = stage_mb / 3 / v;
    const double b_chunk = 2 * stage_mb / 3 / v - w;
    st.bubble = w > 0 ? (l.pp - 1.0) * (f_chunk + b_chunk - w)
                      : (l.pp - 1.0) / v * stage_mb;
    const bool small = static_cast<double>(l.pp) * v * m <= (1 << 16);
    auto table = small && uneven == nullptr
                     ? LayoutScheduleTable(job, l, m)
                     : absl::StatusOr<pipeline::ScheduleTable>(
                           absl::OutOfRangeError("not walked here"));
    if (table.ok()) {
      auto makespan =
          SimulateStepSeconds(*table, [&](const pipeline::ScheduleRow& row) {
            switch (row.op) {
              case pipeline::ScheduleOp::kForward:
                return f_chunk;
              case pipeline::ScheduleOp::kBackward:
                return b_chunk;
              case pipeline::ScheduleOp::kWeight:
                return w;
            }
            return 0.0;
          });
      if (makespan.ok()) st.bubble = std::max(0.0, *makespan - m * stage_mb);
    }
    if (uneven != nullptr) {
      st.bubble = std::max(0.0, uneven->makespan - m * uneven->busy_mb);
    }
  }

  // Optimizer: one pass for the gradient norm, one for the update over this
  // rank's shard of fp32 state.
  const MoeStageParams moe_first = MoeParamsOnStage(job, l, state_stage);
  const double P_local =
      static_cast<double>(StageParams(c, l.tp, l.pp, state_stage,
                                      static_cast<int>(layers), head_stage) +
                          moe_first.delta);
  const double X_local = static_cast<double>(moe_first.experts);
  const double shard = l.zero == ZeroStage::kNone
                           ? P_local
                           : (P_local - X_local) / shards_in + X_local / edp;
  double per_elem = (job.adam ? 32 : 24) + (e != 4 ? e : 0);
  // A 16-bit state (the precision-aware optimizer) is widened to an fp32
  // copy, updated there and rounded back: read s, write 4, the update's 8,
  // read 4, write s, where an fp32 state moves its 8 in place.
  auto lowered = [&](int bytes) {
    const double s16 = dev.elementwise_16bit_at_fp32_cost ? 4.0 : bytes;
    return bytes < 4 ? 8 + 2 * s16 : 0.0;
  };
  if (job.adam) {
    per_elem += lowered(job.exp_avg_bytes) + lowered(job.exp_avg_sq_bytes);
  }
  if (e != 4) per_elem += lowered(job.main_params_bytes);
  const double f_host = l.offload_percent / 100.0;
  st.optimizer = (1 - f_host) * shard * per_elem / bw;
  if (f_host > 0 && dev.host_link_bandwidth > 0) {
    // The host share: its fp32 gradients down and updated parameters up
    // the host link, the CPU AdamW between, all beside the device's share.
    const double copies = f_host * shard * (4 + e) / dev.host_link_bandwidth;
    const double host_update =
        dev.host_memory_bandwidth > 0
            ? f_host * shard * per_elem / dev.host_memory_bandwidth
            : 0;
    st.offload = std::max(0.0, copies + host_update - st.optimizer);
  }

  if (dev.core_share < 1) {
    // Every rank's computing, at a core's speed, shares the node's cores:
    // the step is at least that work spread over them, plus the exposed
    // communication. Pipeline bubbles leave a core to another rank, so they
    // do not add to it; collectives do (measured, 4 ranks on 2 cores: TP 4
    // took 3.4 s where the shared compute alone needs 1.6 s and its
    // collectives 1.7 s, as the group's ranks all wait together).
    // The node's stages' average: the head is one stage's of pp.
    const double busy = st.gemm + st.attention + st.elementwise +
                        st.head / l.pp + st.recompute + st.optimizer;
    const double comm =
        st.tp_comm + st.cp_comm + st.dp_comm + st.pp_comm + st.ep_comm;
    st.core_wait = std::max(0.0, busy / dev.core_share + comm - st.total());
  }

  st.model_flops =
      gpt::TrainingFlopsPerToken(c) * job.global_batch * c.seq_length;
  const double seconds = st.total();
  if (seconds > 0) {
    st.mfu = st.model_flops / (seconds * l.world() * dev.PeakFlops(job.dtype));
    st.tokens_per_second = job.global_batch * c.seq_length / seconds;
  }
  return st;
}

}  // namespace

StepTime EstimateStepTime(const JobSpec& job, const Layout& l) {
  const gpt::GPTConfig& c = job.model;
  const double even_layers = static_cast<double>(c.num_layers) / l.pp;
  const StepTime even = StageStepTime(job, l, even_layers, true, nullptr);
  // Even splits but ZB-V's: every stage but the last a head-less stage's
  // time, as above. ZB-V's V puts the output layer on stage 0's second
  // chunk, so its stages are walked as an uneven split's (with equal
  // head-less stages its bubble came out 5-6% of the step where the CPU-time
  // replay of runs found 0.1-0.5%: stage 0 is the bottleneck and never waits).
  if (l.pp <= 1 ||
      (!UnevenSplit(l) && l.schedule != PipelineSchedule::kZeroBubbleV)) {
    return even;
  }
  // The layout's split: each (rank, chunk)'s time from the per-layer, output
  // layer and embedding times; the table walked with them once.
  const ChunkSeconds chunks = ChunkSecondsOf(
      c, l,
      PipelineWork{even.layer_mb, even.layer_weight_mb, even.head_mb,
                   even.head_weight_mb, even.embedding_mb});
  std::vector<double> busy(l.pp, 0.0);
  double slowest = 0, sum = 0;
  for (int r = 0; r < l.pp; ++r) {
    for (double chunk : chunks.total[r]) busy[r] += chunk;
    slowest = std::max(slowest, busy[r]);
    sum += busy[r];
  }
  const int m = NumMicroBatches(job, l);
  // Beyond 2^16 cells, the slowest stage runs all m micro-batches and the
  // others' one each fill and drain around it (1F1B's closed form).
  double makespan = (m - 1) * slowest + sum;
  if (static_cast<double>(l.pp) * l.virtual_stages * m <= (1 << 16)) {
    auto table = LayoutScheduleTable(job, l, m);
    if (table.ok()) {
      auto walked = WalkStepSeconds(*table, chunks);
      if (walked.ok()) makespan = *walked;
    }
  }
  // Every rank's step: the walked step (its own compute and its bubble),
  // then its own stage's gradient reduction and optimizer step (a stage
  // with more parameters than the slowest one can finish last). The step is
  // the last rank's.
  const int head_stage =
      l.schedule == PipelineSchedule::kZeroBubbleV ? 0 : l.pp - 1;
  StepTime st;
  for (int r = 0; r < l.pp; ++r) {
    const StageOfUnevenLayout stage{r, head_stage, busy[r], makespan};
    StepTime rank = StageStepTime(job, l, StageLayerCount(c, l, r),
                                  r == head_stage, &stage);
    if (r == 0 || rank.total() > st.total()) st = rank;
  }
  // What balancing weighs stays per layer.
  st.layer_mb = even.layer_mb;
  st.layer_weight_mb = even.layer_weight_mb;
  return st;
}

}  // namespace planner
}  // namespace mcc
