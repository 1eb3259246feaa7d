#include "planner/memory_model.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "data/loader.h"
#include "parallel/pipeline/p2p.h"
#include "parallel/pipeline/schedule_table.h"
#include "parallel/pipeline/schedules.h"
#include "planner/moe_model.h"
#include "planner/param_count.h"
#include "planner/schedule_walk.h"
#include "planner/stage_layers.h"

namespace mcc {
namespace planner {
namespace {

// Sizes every formula below uses, for one micro-batch on one rank.
struct Dims {
  double e = 4;   // bytes per element of the model dtype
  double T = 0;   // tokens of the micro-batch on this rank (after CP)
  double Tl = 0;  // rows of the hidden states here (T / TP under SP)
  double h = 0, kv = 0, f = 0, f1 = 0, heads = 0, vocab = 0;
  double t = 1;
  double norm_stats = 2;  // fp32 statistics per row: mean and rstd
};

Dims DimsOf(const JobSpec& job, const Layout& l) {
  const gpt::GPTConfig& c = job.model;
  Dims d;
  d.e = static_cast<double>(DTypeSize(job.dtype));
  d.t = l.tp;
  d.T = static_cast<double>(l.micro_batch) * c.seq_length / l.cp;
  d.Tl = l.sequence_parallel ? d.T / l.tp : d.T;
  d.h = static_cast<double>(c.hidden_size);
  d.kv = static_cast<double>(c.query_groups() * c.head_dim());
  d.f = static_cast<double>(c.ffn());
  d.f1 = c.activation == gpt::Activation::kSwiGLU ? 2 * d.f : d.f;
  d.heads = c.num_attention_heads;
  d.vocab = static_cast<double>(c.padded_vocab_size(l.tp));
  d.norm_stats = c.normalization == gpt::Normalization::kLayerNorm ? 2 : 1;
  return d;
}

// What one micro-batch's record of a model chunk holds between its forward
// and backward, and the transients of each step.
struct ChunkCost {
  double record = 0;
  double forward_transient = 0;
  double backward_transient = 0;
};

ChunkCost CostOfChunk(const JobSpec& job, const Layout& l, int layers, bool pre,
                      bool post, int first_layer) {
  const Dims d = DimsOf(job, l);
  const double layer = LayerActivationBytes(job, l);
  const double hidden = d.Tl * d.h * d.e;  // One hidden-state tensor.
  ChunkCost c;
  // Layers: full recomputation keeps each recomputed chunk's input only and
  // rebuilds its records, all at once, in the backward.
  int recomputed = 0, kept_inputs = 0, rebuilt_at_once = 0;
  if (l.recompute == Recompute::kFull) {
    const int n = std::max(1, job.model.recompute_num_layers);
    if (job.model.recompute_method == gpt::RecomputeMethod::kUniform) {
      recomputed = layers;
      kept_inputs = (layers + n - 1) / n;
      rebuilt_at_once = std::min(n, layers);
    } else {
      recomputed = std::min(n, layers);
      kept_inputs = recomputed;
      rebuilt_at_once = recomputed > 0 ? 1 : 0;
    }
  }
  c.record = (layers - recomputed) * layer + kept_inputs * hidden;
  // MoE layers hold the router's and experts' records in place of the
  // dense MLP's (the recomputed ones taken as the chunk's share).
  const int moe = MoeLayersIn(job.model, first_layer, layers);
  const MoeLayerWork mw = MoeWork(job, l);
  const double moe_layer = mw.record_bytes - mw.dense_record_bytes;
  if (moe > 0) c.record += moe * moe_layer * (layers - recomputed) / layers;
  // A layer's backward (models/gpt TransformerLayer::Backward) peaks in the
  // attention kernel's backward: four hidden-state gradients (the layer's
  // output gradient, which its caller holds through the call: received from
  // the next stage, or the final norm's; dh1, the second norm's and its
  // input's), the dense MLP's two input gradients,
  // which live to the end of the layer's backward, and attention's: the
  // projection's input gradient, the output gradient in head layout, dq, dk,
  // dv and the fused dQKV they merge into, beside one thread's fp32 kernel
  // scratch (about 8 sequence x head-dim floats). Traced with the
  // allocator's live tensors at the peak of a PP 2 stage 0 (the planner had
  // taken the larger of the MLP's and attention's only: -5.8%). Under SP,
  // the all-gathered input of a column-parallel layer for its weight
  // gradient.
  const double mlp_grads = d.T * (d.f + d.f1) / d.t * d.e;
  const double local_seq = static_cast<double>(job.model.seq_length) / l.cp;
  const double attn_scratch = 8 * local_seq * job.model.head_dim() * 4;
  double attn_grads =
      d.T * (2 * d.h + 2 * (d.h + 2 * d.kv)) / d.t * d.e + attn_scratch;
  const double gathered = l.sequence_parallel ? d.T * d.h * d.e : 0;
  // Forward: the fused QKV output before it splits into q, k, v.
  c.forward_transient = d.T * (d.h + 2 * d.kv) / d.t * d.e + gathered;
  if (l.cp > 1) {
    // Ring attention's buffers (parallel/context_parallel/ring_attention.cc)
    // for this rank's Q = T h / TP query and KV = T kv / TP key (and value)
    // elements. Forward, beside the fused QKV output: fp32 accumulators for
    // both chunks (4 Q bytes) and one chunk's partial result (2 Q), the key
    // and value block in use and the one arriving (4 KV e). Backward, beside
    // the attention gradients: the fp32 dq accumulators and part (6 Q), the
    // dk and dv parts (4 KV), the key/value blocks (4 KV e), their fp32
    // gradients travelling with them, in use and arriving (16 KV), and the
    // output gradient in chunk layout (Q e).
    const double q = d.T * d.h / d.t, kv = d.T * d.kv / d.t;
    const double lse = d.T * d.heads / d.t * 4;
    c.forward_transient += 6 * q + 4 * kv * d.e + 1.5 * lse;
    attn_grads += 6 * q + 20 * kv + 4 * kv * d.e + q * d.e;
  }
  // An MoE layer's backward frees its experts' buffers before attention's.
  const double branch_grads =
      std::max(moe < layers ? mlp_grads + attn_grads : 0.0,
               moe > 0 ? std::max(attn_grads, mw.backward_bytes) : 0.0);
  c.backward_transient = 4 * hidden + branch_grads + gathered +
                         rebuilt_at_once * (layer + (moe > 0 ? moe_layer : 0));
  if (pre) {
    c.record += 2 * d.T * 8;  // int64 token ids and positions
  }
  if (post) {
    // Final norm input and statistics, the output layer's input, the
    // logits (model dtype), cross entropy's fp32 row maxima and sums and
    // int64 targets.
    const double logits = d.T * d.vocab / d.t * d.e;
    const double head_record =
        2 * hidden + d.norm_stats * d.Tl * 4 + logits + 3 * d.T * 4 + d.T * 8;
    c.record += head_record;
    // Backward: the logits' gradient while the logits are still held, and
    // the fp32 per-token loss gradient. Cross entropy's backward frees the
    // logits before the output layer's computes its input gradient, so that
    // one is never beside both (counting it over-predicted a one-process
    // run and the last pipeline stage by one hidden-state tensor). The
    // layers' backward comes after the head's, which has freed its record
    // by then (seen in the allocator's live tensors: one rank's peak in
    // cross entropy's backward, not in the last layer's).
    c.backward_transient =
        std::max(c.backward_transient - head_record, logits + d.T * 4);
  }
  return c;
}

// Messages the executor (pipeline_executor.cc) holds beside the records
// while each of this rank's rows runs, per row.
struct HeldMessages {
  // Sent tensors, kept with overlapped transfers until their batch is
  // waited for: a batch that also receives (not in a V) before the first
  // row it brings an input to; else before the backward of a forward output
  // it holds, or at the step's end.
  std::vector<int> sent;
  // Inputs that exist before their row: receives posted ahead (the
  // interleaved steady state posts a backward's gradient with the forward
  // before it; a V receives ahead), and in a V what one chunk hands the
  // other. A forward's input is its record once it runs, and a backward's
  // is the output gradient its layers' backward counts.
  std::vector<int> waiting;
};

// The actions of `rows`.
std::vector<pipeline::Action> ActionsOf(
    const std::vector<pipeline::ScheduleRow>& rows) {
  std::vector<pipeline::Action> actions;
  for (const pipeline::ScheduleRow& r : rows) {
    pipeline::Action a;
    a.kind = r.op == pipeline::ScheduleOp::kForward ? pipeline::Action::kForward
             : r.op == pipeline::ScheduleOp::kBackward
                 ? pipeline::Action::kBackward
                 : pipeline::Action::kWeight;
    a.microbatch = r.microbatch;
    a.chunk = r.chunk;
    actions.push_back(a);
  }
  return actions;
}

HeldMessages WalkHeldMessages(const JobSpec& job, const Layout& l, int m,
                              int stage,
                              const std::vector<pipeline::ScheduleRow>& rows) {
  const int n = static_cast<int>(rows.size());
  HeldMessages held;
  held.sent.assign(n, 0);
  held.waiting.assign(n, 0);
  if (l.pp < 2) return held;
  const std::vector<pipeline::Action> actions = ActionsOf(rows);
  const bool v_shape = l.schedule == PipelineSchedule::kZeroBubbleV;
  const pipeline::StageLayout layout{l.pp, stage, std::max(1, l.virtual_stages),
                                     v_shape};
  // A V plans its receives from every stage's order.
  std::vector<std::vector<pipeline::Action>> orders;
  if (v_shape) {
    for (int r = 0; r < l.pp; ++r) {
      auto other = LayoutRankRows(job, l, m, r);
      if (!other.ok()) return held;
      orders.push_back(ActionsOf(*other));
    }
  }
  // count messages held on the rows [from, to).
  auto add = [&](std::vector<int>* v, int from, int to, int count = 1) {
    for (int j = std::max(0, from); j < to && j < n; ++j) (*v)[j] += count;
  };
  for (const pipeline::TransferBatch& b :
       pipeline::PlanTransfers(layout, actions, v_shape ? &orders : nullptr)) {
    for (int j : b.recv_actions) add(&held.waiting, b.first_action, j);
    if (b.send_actions.empty() || !job.overlap_p2p) continue;
    int release = n;
    if (!b.recv_actions.empty() && !v_shape) {
      release = *std::min_element(b.recv_actions.begin(), b.recv_actions.end());
    } else {
      for (int i : b.send_actions) {
        if (actions[i].kind != pipeline::Action::kForward) continue;
        for (int j = i + 1; j < n; ++j) {
          if (actions[j].kind == pipeline::Action::kBackward &&
              actions[j].chunk == actions[i].chunk &&
              actions[j].microbatch == actions[i].microbatch) {
            release = std::min(release, j);
            break;
          }
        }
      }
    }
    add(&held.sent, b.first_action, release,
        static_cast<int>(b.send_actions.size()));
  }
  // The V's turn: held from the producing row's end to the consuming row.
  for (int i = 0; i < n; ++i) {
    if (!layout.HandsOffLocally(actions[i])) continue;
    const pipeline::Action c = layout.LocalConsumer(actions[i]);
    for (int j = i + 1; j < n; ++j) {
      if (actions[j].kind == c.kind && actions[j].chunk == c.chunk &&
          actions[j].microbatch == c.microbatch) {
        add(&held.waiting, i + 1, j);
        break;
      }
    }
  }
  return held;
}

// WalkHeldMessages, remembered for generated schedules: they depend on the
// schedule's shape only, and a search plans many layouts of one shape (a V
// simulates every stage's order for each stage).
HeldMessages HeldMessagesAtRows(
    const JobSpec& job, const Layout& l, int m, int stage,
    const std::vector<pipeline::ScheduleRow>& rows) {
  if (l.schedule == PipelineSchedule::kFile) {
    return WalkHeldMessages(job, l, m, stage, rows);
  }
  using Key = std::tuple<int, int, int, int, int, bool>;
  thread_local std::map<Key, HeldMessages> cache;
  const Key key{static_cast<int>(l.schedule),
                l.pp,
                l.virtual_stages,
                m,
                stage,
                job.overlap_p2p};
  auto it = cache.find(key);
  if (it != cache.end() && it->second.sent.size() == rows.size()) {
    return it->second;
  }
  if (cache.size() > 4096) cache.clear();
  return cache[key] = WalkHeldMessages(job, l, m, stage, rows);
}

}  // namespace

double ChunkRecordBytes(const JobSpec& job, const Layout& layout, int layers,
                        bool pre, bool post, int first_layer) {
  return CostOfChunk(job, layout, layers, pre, post, first_layer).record;
}

double WeightGradRecordBytes(const JobSpec& job, const Layout& l, int layers,
                             bool pre, bool post) {
  const Dims d = DimsOf(job, l);
  const bool row_bias_sp = job.model.add_bias_linear && l.sequence_parallel;
  // Per layer: QKV's gathered input and output gradient, the projection's
  // input and (gathered) output gradient, FC1's and FC2's likewise; a
  // row-parallel bias keeps its own sequence-parallel gradient.
  double layer = d.T * d.h + d.T * (d.h + 2 * d.kv) / d.t;  // QKV
  layer += d.T * d.h / d.t + d.T * d.h;                     // projection
  layer += d.T * d.h + d.T * d.f1 / d.t;                    // FC1
  layer += d.T * d.f / d.t + d.T * d.h;                     // FC2
  if (row_bias_sp) layer += 2 * d.Tl * d.h;
  double bytes = layers * layer * d.e;
  if (pre) bytes += 2 * d.T * 8 + d.T * d.h * d.e;  // ids, positions, grad
  if (post) bytes += d.T * d.vocab / d.t * d.e + d.T * d.h * d.e;
  return bytes;
}

double LayerActivationBytes(const JobSpec& job, const Layout& l) {
  const Dims d = DimsOf(job, l);
  // torchtitan's op-level policy (kSelectiveOps) is counted as keeping
  // everything: an upper bound, it is only modelled for comparison.
  const bool keep_attention = l.recompute != Recompute::kSelective;
  double elems = 4 * d.Tl * d.h;                 // ln1, QKV, ln2, fc1 inputs
  elems += d.T * (d.h + 2 * d.kv) / d.t;         // q, k, v
  elems += d.T * d.h / d.t;                      // proj input (context)
  if (keep_attention) elems += d.T * d.h / d.t;  // attention output
  elems += d.T * (d.f1 + d.f) / d.t;             // fc1 output, fc2 input
  double bytes = elems * d.e;
  bytes += 2 * d.norm_stats * d.Tl * 4;  // two norms' fp32 statistics
  if (keep_attention) bytes += d.T * d.heads / d.t * 4;  // log-sum-exp
  return bytes;
}

int NumMicroBatches(const JobSpec& job, const Layout& l) {
  return static_cast<int>(job.global_batch / (l.micro_batch * l.dp));
}

absl::Status CheckLayout(const JobSpec& job, const Layout& l) {
  const gpt::GPTConfig& c = job.model;
  auto bad = [&](auto... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", l.Name(), ": ", parts...));
  };
  if (l.tp < 1 || l.pp < 1 || l.dp < 1 || l.cp < 1 || l.virtual_stages < 1 ||
      l.micro_batch < 1) {
    return bad("every size must be positive");
  }
  if (l.world() != job.cluster.world()) {
    return bad("TP x PP x DP x CP = ", l.world(), " is not the cluster's ",
               job.cluster.world(), " devices");
  }
  if (UnevenSplit(l)) {
    // As train splits them (its flags named), interleaving refused.
    if (absl::Status s = CheckStageSplit(c, l); !s.ok())
      return bad(s.message());
  } else if (c.num_layers % (l.pp * l.virtual_stages) != 0) {
    return bad(c.num_layers, " layers do not split into ",
               l.pp * l.virtual_stages, " (virtual) stages");
  }
  if (l.virtual_stages > 1 && l.pp == 1) {
    return bad("virtual stages need pipeline parallelism");
  }
  if (l.sequence_parallel && l.tp == 1) {
    return bad("sequence parallelism needs TP > 1");
  }
  if (absl::Status s = c.Validate(l.tp, l.sequence_parallel); !s.ok()) {
    return bad(s.message());
  }
  if (absl::Status s = CheckMoeLayout(job, l); !s.ok()) return s;
  if (l.cp > 1 && c.seq_length % (2 * l.cp) != 0) {
    return bad("sequence ", c.seq_length, " does not split into 2 x CP ",
               2 * l.cp, " chunks");
  }
  if (job.global_batch % (l.micro_batch * l.dp) != 0) {
    return bad("global batch ", job.global_batch,
               " is not a multiple of micro-batch x DP ", l.micro_batch * l.dp);
  }
  if (l.virtual_stages > 1 && NumMicroBatches(job, l) % l.pp != 0) {
    return bad("the interleaved schedule needs a multiple of PP ", l.pp,
               " micro-batches, not ", NumMicroBatches(job, l));
  }
  if (l.schedule == PipelineSchedule::kZeroBubbleH1 && l.virtual_stages > 1) {
    return bad("zb-h1 runs one model chunk per stage");
  }
  if (l.schedule == PipelineSchedule::kZeroBubbleV && l.virtual_stages != 2) {
    return bad("zbv runs two model chunks per stage, not ", l.virtual_stages);
  }
  if (l.pp > 1 && l.schedule != PipelineSchedule::kOneFOneB) {
    // The executor's table for this shape (a file's must match it).
    auto table = LayoutScheduleTable(job, l, NumMicroBatches(job, l));
    if (!table.ok()) return bad(table.status().message());
  }
  if (l.instances < 1 || (l.dp * l.cp) % l.instances != 0) {
    return bad(l.instances, " optimizer instances do not divide DP x CP ",
               l.dp * l.cp);
  }
  if (l.zero == ZeroStage::kNone &&
      (job.exp_avg_bytes != 4 || job.exp_avg_sq_bytes != 4 ||
       job.main_params_bytes != 4)) {
    return bad("the precision-aware optimizer needs sharded state (ZeRO >= 1)");
  }
  if (l.instances > 1 && l.zero == ZeroStage::kNone) {
    return bad("optimizer instances (HSDP) need sharded state (ZeRO >= 1)");
  }
  if (job.model.num_experts > 0 && ExpertDataParallel(l) % l.instances != 0) {
    // The experts' state splits into the instances too (train's
    // RankLayout refuses this).
    return bad(l.instances, " optimizer instances do not divide expert DP ",
               ExpertDataParallel(l));
  }
  if (l.offload_percent < 0 || l.offload_percent > 100) {
    return bad("offload ", l.offload_percent, "% is not 0-100");
  }
  if (l.offload_percent > 0) {
    if (job.cluster.device.host_link_bandwidth <= 0) {
      return bad("optimizer offload is for GPUs: the ", job.cluster.device.name,
                 " device's state is already in host memory");
    }
    if (l.zero == ZeroStage::kNone) {
      return bad("optimizer offload needs the distributed optimizer");
    }
  }
  return absl::OkStatus();
}

MemoryBreakdown EstimateStageMemory(const JobSpec& job, const Layout& l,
                                    int stage) {
  const gpt::GPTConfig& c = job.model;
  const double e = static_cast<double>(DTypeSize(job.dtype));
  // This stage's runs of layers, one a model chunk.
  const std::vector<pipeline::LayerRange> ranges =
      StageLayerRanges(c, l, stage);
  int layers = 0;
  for (const pipeline::LayerRange& r : ranges) layers += r.count;
  const int chunks = l.virtual_stages;
  const int m = NumMicroBatches(job, l);
  MemoryBreakdown mem;
  mem.stage = stage;
  const MoeStageParams moe = MoeParamsOnStage(job, l, stage);
  // ZB-V's V puts the last virtual stage, with the output layer, on stage 0.
  const int head_stage = l.schedule == PipelineSchedule::kZeroBubbleV ? 0 : -1;
  mem.params =
      StageParams(c, l.tp, l.pp, stage, layers, head_stage) + moe.delta;
  const double P = static_cast<double>(mem.params);
  // Optimizer state is sharded over the data-parallel ranks (with CP, over
  // DP x CP, as Megatron's distributed optimizer does), under HSDP over one
  // instance's share of them and replicated across the instances; experts'
  // over the expert-data-parallel ranks (under HSDP an instance's share).
  // Ps: this rank's share of sharded elements.
  const double shards = static_cast<double>(l.dp) * l.cp / l.instances;
  const double expert_shards =
      static_cast<double>(ExpertDataParallel(l)) / l.instances;
  const double Ps = (P - moe.experts) / shards +
                    static_cast<double>(moe.experts) / expert_shards;
  // Bytes a parameter of the states (fp32, or the precision-aware
  // optimizer's 16-bit moments) and of the main copy (16-bit weights only).
  const double state_bytes =
      job.adam ? job.exp_avg_bytes + job.exp_avg_sq_bytes : 4;
  const double main_bytes = e == 4 ? 0 : job.main_params_bytes;
  // The largest FSDP unit: a layer, the embeddings (with a tied output
  // layer on one stage) or the head.
  const ParamCount pc = CountParams(c, l.tp);
  const bool tied_here = !c.untie_embeddings_and_output_weights && l.pp == 1;
  const double unit = static_cast<double>(
      std::max({pc.layer + (moe.layers > 0 ? moe.delta / moe.layers : 0),
                pc.embedding, pc.final_norm + pc.output_layer}));
  // Between the backward and the optimizer (activations freed) the
  // gradient reduction may hold buffers of its own.
  double sync_transient = 0;
  // A reduce-scatter's partial sums over more than two ranks, per byte of
  // its input.
  const double rs_partials =
      shards > 2 ? static_cast<double>(
                       job.cluster.device.reduce_scatter_partial_blocks) /
                       shards
                 : 0;
  switch (l.zero) {
    case ZeroStage::kNone:
      mem.weights = P * e;
      mem.gradients = 4 * P;
      mem.main_weights = e == 4 ? 0 : 4 * P;
      mem.optimizer_state = state_bytes * P;
      break;
    case ZeroStage::kOptimizer:
      mem.weights = P * e;
      mem.gradients = 4 * P;
      mem.main_weights = main_bytes * Ps;
      mem.optimizer_state = state_bytes * Ps;
      // DDP keeps a copy of this rank's updated shard as the parameter
      // all-gather's input; the reduce-scatter of a bucket may hold partial
      // sums of its own.
      if (shards > 1) {
        mem.comm_buffers = e * Ps;
        const double bucket_elems = static_cast<double>(job.bucket_bytes) / 4;
        sync_transient = rs_partials * 4 * std::min(P, bucket_elems);
      }
      break;
    case ZeroStage::kGradients:
    case ZeroStage::kParameters: {
      // Per unit: fp32 main and gradient shards. At the activation peak
      // (the head's backward) one unit's full fp32 gradient is held and one
      // reduce-scatter output may be pending; later units' buffers (and a
      // reduce-scatter's partial sums) come as activations go.
      mem.main_weights = 4 * Ps;
      mem.optimizer_state = state_bytes * Ps;
      mem.gradients = 4 * Ps + 4 * unit;
      mem.comm_buffers = 4 * unit / shards;
      if (l.zero == ZeroStage::kGradients) {
        mem.weights = P * e;
      } else {
        // Gathered units: the one computing (two when the tied embedding
        // stays open through the head) and the one prefetched.
        mem.weights = std::min(P, unit * (tied_here ? 3 : 2)) * e;
        if (e != 4) mem.comm_buffers += e * unit / shards;  // send shard
      }
      break;
    }
  }
  // Activations: walk this stage's rows of the table the executor runs,
  // adding a record at each forward and dropping it after its backward
  // (B), or, when the table splits the backward, keeping what the weight
  // gradient needs from B to W; beside them the messages the executor
  // holds (HeldMessagesAtRows).
  const double message = DimsOf(job, l).Tl * c.hidden_size * e;
  const int last_stage = l.pp * chunks - 1;
  std::vector<ChunkCost> cost(chunks);
  std::vector<double> weight_record(chunks);
  const pipeline::ScheduleShape shape{
      l.pp, chunks, std::max(m, 1),
      l.schedule == PipelineSchedule::kZeroBubbleV};
  auto rows = LayoutRankRows(job, l, m, stage);
  const bool split = LayoutSplitsBackward(job, l);
  for (int k = 0; k < chunks; ++k) {
    const int v = VirtualStageOf(shape, stage, k);
    const pipeline::LayerRange& r = ranges[k];
    cost[k] = CostOfChunk(job, l, r.count, v == 0, v == last_stage, r.first);
    weight_record[k] =
        split ? WeightGradRecordBytes(job, l, r.count, v == 0, v == last_stage)
              : 0;
  }
  double held = 0, messages = 0, peak_act = 0, peak_sent = 0, peak_total = 0;
  int records = 0;
  auto consider = [&](double transient) {
    if (held + messages + transient > peak_total) {
      peak_total = held + messages + transient;
      peak_act = held;
      peak_sent = messages;
    }
  };
  if (rows.ok()) {
    const HeldMessages at = HeldMessagesAtRows(job, l, m, stage, *rows);
    for (size_t i = 0; i < rows->size(); ++i) {
      const pipeline::ScheduleRow& a = (*rows)[i];
      const ChunkCost& cc = cost[a.chunk];
      messages = (at.sent[i] + at.waiting[i]) * message;
      switch (a.op) {
        case pipeline::ScheduleOp::kForward:
          held += cc.record;
          ++records;
          mem.in_flight = std::max(mem.in_flight, records);
          consider(cc.forward_transient);
          break;
        case pipeline::ScheduleOp::kBackward:
          consider(cc.backward_transient);
          held += weight_record[a.chunk] - cc.record;
          if (!split) --records;
          break;
        case pipeline::ScheduleOp::kWeight:
          // The weight GEMMs accumulate into main_grad: nothing new.
          consider(0);
          held -= weight_record[a.chunk];
          --records;
          break;
      }
    }
  }
  mem.comm_buffers += peak_sent;
  peak_total -= peak_sent;
  mem.activations = peak_act;
  mem.workspace = peak_total - peak_act;
  if (sync_transient > peak_total) {
    // The peak is the gradient reduction's, after the activations are gone.
    mem.activations = 0;
    mem.workspace = 0;
    mem.comm_buffers += sync_transient;
    mem.peak_at = "the gradient reduction";
  }
  // Every rank loads whole sequences (data/loader.cc MakeMicroBatch: int64
  // tokens and labels, fp32 loss mask, int64 positions) and the step keeps
  // all of its micro-batches but their positions (training/model_batch.cc)
  // until the next step's replace them; on a GPU they are staged to device
  // copies, on the CPU they are the loader's, whose queue holds
  // LoaderConfig::prefetch more. Traced at a PP 2 stage 0's peak: 98304
  // bytes (4 + 4 micro-batches of 512 tokens), the larger part of what the
  // planner had missed there (-0.27%).
  const double tokens = static_cast<double>(l.micro_batch) * c.seq_length;
  mem.input_batches = m * tokens * (8 + 8 + 4);
  if (job.cluster.device.host_link_bandwidth <= 0) {
    mem.input_batches +=
        data::LoaderConfig().prefetch * tokens * (8 + 8 + 4 + 8);
  }
  double live = mem.weights + mem.gradients + mem.main_weights +
                mem.optimizer_state + mem.activations + mem.comm_buffers +
                mem.workspace + mem.input_batches;
  if (l.zero == ZeroStage::kOptimizer) {
    // DDP's setup for the distributed optimizer (DistributedDataParallel::
    // Create) copies the parameters into their new buffer while the old
    // tensors are still held, beside the fp32 gradient buffer and before
    // the optimizer's state or any activation exists. Over many shards with
    // small activations that is the run's peak (fp32: 12 bytes a parameter
    // against a step's 8 + 12 / shards and its activations).
    const double setup = 2 * e * P + 4 * P;
    if (setup > live) {
      mem.main_weights = 0;
      mem.optimizer_state = 0;
      mem.activations = 0;
      mem.workspace = 0;
      mem.input_batches = 0;     // The loader starts after the wrap.
      mem.comm_buffers = e * P;  // The parameter buffer being filled.
      live = setup;
      mem.peak_at = "DDP's setup";
    }
  }
  if (l.offload_percent > 0) {
    // The offloaded share of the fp32 main weights and the optimizer's
    // state lives in pinned host memory (Megatron's hybrid optimizer).
    const double f = l.offload_percent / 100.0;
    mem.host_bytes = f * (mem.main_weights + mem.optimizer_state);
    mem.main_weights *= 1 - f;
    mem.optimizer_state *= 1 - f;
    live -= mem.host_bytes;
  }
  mem.allocator_overhead = live * job.cluster.device.allocator_overhead;
  return mem;
}

absl::StatusOr<MemoryBreakdown> EstimatePeakMemory(const JobSpec& job,
                                                   const Layout& l) {
  if (absl::Status s = CheckLayout(job, l); !s.ok()) return s;
  MemoryBreakdown worst;
  for (int stage = 0; stage < l.pp; ++stage) {
    MemoryBreakdown m = EstimateStageMemory(job, l, stage);
    if (stage == 0 || m.total() > worst.total()) worst = m;
  }
  return worst;
}

}  // namespace planner
}  // namespace mcc
