#include "planner/plan_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/allocator.h"
#include "nlohmann/json.hpp"
#include "planner/megatron_memory.h"
#include "planner/moe_model.h"
#include "planner/param_count.h"
#include "planner/schedule_walk.h"
#include "planner/stage_balance.h"
#include "planner/stage_layers.h"

namespace mcc {
namespace planner {
namespace {

std::string GiB(double bytes) {
  return absl::StrFormat("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
}
std::string Ms(double seconds) {
  return absl::StrFormat("%.2f ms", seconds * 1e3);
}

std::string Describe(const JobSpec& job) {
  const gpt::GPTConfig& c = job.model;
  return absl::StrFormat(
      "model: %d layers, hidden %d, %d heads (%d groups), ffn %d, vocabulary "
      "%d, sequence %d, %.3gM parameters, %s; global batch %d; %s on %d x %d "
      "%s",
      c.num_layers, c.hidden_size, c.num_attention_heads, c.query_groups(),
      c.ffn(), c.vocab_size, c.seq_length, ModelParams(c) / 1e6,
      std::string(DTypeName(job.dtype)), job.global_batch,
      job.adam ? "AdamW" : "SGD", job.cluster.nodes,
      job.cluster.devices_per_node, job.cluster.device.name);
}

}  // namespace

std::string FormatTable(const JobSpec& job,
                        const std::vector<Prediction>& predictions) {
  std::string out = Describe(job) + "\n";
  absl::StrAppendFormat(&out, "%-4s %-38s %10s %10s %10s %7s %s\n", "#",
                        "layout", "memory", "step", "bubble", "MFU", "");
  int i = 0;
  for (const Prediction& p : predictions) {
    absl::StrAppendFormat(
        &out, "%-4d %-38s %10s %10s %10s %6.1f%% %s%s\n", ++i, p.layout.Name(),
        GiB(p.memory.total()), Ms(p.time.total()), Ms(p.time.bubble),
        100 * p.time.mfu, p.fits ? "" : "DOES NOT FIT ",
        p.unsupported.empty() ? "" : "(" + p.unsupported + ")");
  }
  // Layouts closer to the first than the probe moves between runs are not
  // reliably ordered: say so, so the user measures them before choosing.
  const double spread = job.cluster.device.prediction_spread;
  if (spread > 0 && predictions.size() > 1) {
    const double first = predictions[0].time.total();
    size_t close = 1;
    while (close < predictions.size() &&
           predictions[close].time.total() <= first * (1 + spread)) {
      ++close;
    }
    if (close > 1) {
      absl::StrAppendFormat(
          &out,
          "note: layouts 1-%d%s are predicted within %.0f%% of the first, "
          "inside how far this device's probe moves between runs: their "
          "order is not reliable; measure them before choosing "
          "(tools/bench/plan_check)\n",
          close,
          close == predictions.size() ? " (all shown; --top shows more)" : "",
          100 * spread);
    }
  }
  return out + ProbeDriftNote(job.cluster.device);
}

// The stages' predicted times with the even split and with the split
// that balances them (the output layer and loss on the last stage, the
// embedding on the first).
std::string FormatStageBalance(const JobSpec& job, const Layout& l,
                               const StepTime& t) {
  const int m = NumMicroBatches(job, l);
  // Steps and idle shares under the layout's own schedule (its table
  // walked with these stage times; 1F1B's closed form for 1F1B).
  std::string schedule;
  auto line = [&](const StageSplit& split) {
    const double step = ScheduleStepSeconds(job, l, split, &schedule);
    std::vector<std::string> stages;
    for (size_t i = 0; i < split.layers.size(); ++i) {
      // Rounding may put the busiest stage a hair past the step.
      const double idle =
          step > 0 ? std::max(0.0, 1 - m * split.seconds[i] / step) : 0;
      stages.push_back(absl::StrFormat("%d layers %s (idle %.1f%%)",
                                       split.layers[i], Ms(split.seconds[i]),
                                       100 * idle));
    }
    return absl::StrFormat("%s; %s step %s\n", absl::StrJoin(stages, ", "),
                           schedule, Ms(step));
  };
  // Equal stages: every stage a head-less one's time.
  StageSplit equal = EvenStageSplit(job, l, t);
  equal.chunks = ChunkSeconds();  // Each stage's time shared by its chunks.
  const double equal_stage = t.layer_mb * job.model.num_layers / l.pp;
  for (size_t i = 0; i < equal.seconds.size(); ++i) {
    equal.seconds[i] = equal_stage;
    equal.weight_seconds[i] = t.layer_weight_mb * job.model.num_layers / l.pp;
  }
  const double equal_step = ScheduleStepSeconds(job, l, equal, &schedule);
  const StageSplit even = EvenStageSplit(job, l, t);
  std::string out = absl::StrCat(
      "pipeline stages, per micro-batch forward and backward (a layer ",
      Ms(t.layer_mb), ", output layer and loss ", Ms(t.head_mb), ", embedding ",
      Ms(t.embedding_mb), "; equal stages would idle ",
      absl::StrFormat("%.1f%%", equal_step > 0
                                    ? 100 * (1 - m * equal_stage / equal_step)
                                    : 0.0),
      " under ", schedule, "):\n  even split: ", line(even));
  if (l.virtual_stages > 1 && l.schedule != PipelineSchedule::kZeroBubbleV) {
    absl::StrAppend(&out,
                    "  (uneven splits do not combine with the interleaved "
                    "schedule's virtual stages; they do with zbv)\n");
    return out;
  }
  if (l.first_stage_layers > 0 || l.last_stage_layers > 0) {
    const StageSplit own = LayoutStageSplit(job, l, t);
    absl::StrAppend(&out, "  this layout's split, ", own.Flags(), ": ",
                    line(own));
  }
  const StageSplit balanced = BalancedStageSplit(job, l, t);
  if (balanced.first_stage_layers == 0 && balanced.last_stage_layers == 0) {
    absl::StrAppend(&out, "  the even split is the most balanced\n");
  } else {
    absl::StrAppend(
        &out, "  balanced with ", balanced.Flags(),
        l.schedule == PipelineSchedule::kZeroBubbleV
            ? " (each stage's layers halved over its two chunks; without "
              "--num-layers-per-virtual-pipeline-stage)"
            : "",
        ": ", line(balanced));
  }
  return out;
}

std::string FormatExplain(const JobSpec& job, const Prediction& p) {
  const MemoryBreakdown& m = p.memory;
  const StepTime& t = p.time;
  const Layout& l = p.layout;
  const int micro_batches = NumMicroBatches(job, l);
  const MegatronMemory meg = MegatronTheoreticalMemory(job, l, micro_batches);
  std::string out = Describe(job) + "\n";
  absl::StrAppendFormat(
      &out,
      "layout %s: TP %d%s, PP %d (%d virtual), DP %d, CP %d, ZeRO %d (%s), "
      "recompute %s, micro-batch %d, %d micro-batches a step\n",
      l.Name(), l.tp, l.sequence_parallel ? " with SP" : "", l.pp,
      l.virtual_stages, l.dp, l.cp, static_cast<int>(l.zero),
      std::string(ZeroStageName(l.zero)),
      std::string(RecomputeName(l.recompute)), l.micro_batch, micro_batches);
  absl::StrAppend(&out, DescribeMoe(job, l));
  if (l.pp > 1) {
    absl::StrAppend(&out, "  pipeline schedule: ",
                    l.schedule == PipelineSchedule::kOneFOneB
                        ? (l.virtual_stages > 1 ? "interleaved 1F1B" : "1F1B")
                        : PipelineScheduleName(l.schedule),
                    " (the executor's table, walked row by row)\n");
  }
  if (l.instances > 1) {
    absl::StrAppendFormat(&out,
                          "  HSDP: %d optimizer instances of %d ranks each\n",
                          l.instances, l.dp * l.cp / l.instances);
  }
  if (!p.unsupported.empty()) {
    absl::StrAppend(&out, "  note: train cannot run it yet: ", p.unsupported,
                    "\n");
  }
  absl::StrAppendFormat(
      &out,
      "memory of the largest rank (pipeline stage %d, %d parameters), at its "
      "peak during %s:\n",
      m.stage, m.params, m.peak_at);
  auto row = [&](const char* name, double bytes, const std::string& why) {
    absl::StrAppendFormat(&out, "  %-20s %12s  %s\n", name, GiB(bytes), why);
  };
  row("weights", m.weights, "model dtype");
  row("gradients", m.gradients, "fp32 main_grad");
  auto width = [](int bytes) { return bytes == 4 ? "fp32" : "16-bit"; };
  row("main weights", m.main_weights,
      absl::StrCat(width(job.main_params_bytes), " master copy"));
  row("optimizer state", m.optimizer_state,
      job.adam ? absl::StrCat("Adam m (", width(job.exp_avg_bytes), "), v (",
                              width(job.exp_avg_sq_bytes), ")")
               : std::string("momentum"));
  row("activations", m.activations,
      absl::StrCat(m.in_flight, " micro-batch chunk record(s) in flight"));
  row("comm buffers", m.comm_buffers, "pipeline, gather/scatter");
  row("workspace", m.workspace, "transients at the peak");
  row("input batches", m.input_batches,
      job.cluster.device.host_link_bandwidth <= 0
          ? "the step's micro-batches and the loader's prefetched ones"
          : "the step's micro-batches, staged");
  row("allocator overhead", m.allocator_overhead, "");
  row("total", m.total(),
      absl::StrCat("of ", GiB(job.cluster.device.memory_bytes),
                   p.fits ? ": fits" : ": DOES NOT FIT"));
  if (m.host_bytes > 0) {
    row("host (offloaded)", m.host_bytes,
        absl::StrCat(l.offload_percent,
                     "% of main weights and state in pinned host memory"));
  }
  row("Megatron's estimate", meg.total(),
      absl::StrCat("theoretical_memory_usage: ", GiB(meg.weights_and_optimizer),
                   " weights and optimizer + ", GiB(meg.activations),
                   " activations",
                   job.model.num_experts > 0
                       ? " (its dense formula: the experts not counted)"
                       : ""));
  if (l.pp > 1 && UnevenSplit(l)) {
    const int first = StageLayerCount(job.model, l, 0);
    const MegatronMemory own =
        MegatronFormulaForFirstStage(job, l, micro_batches, first);
    absl::StrAppendFormat(
        &out,
        "  %-20s %12s  its formula assumes an even split (%g layers on the "
        "first stage); with this layout's %d there\n",
        "", GiB(own.total()), static_cast<double>(job.model.num_layers) / l.pp,
        first);
  }
  absl::StrAppend(&out, "step time of the slowest stage:\n");
  auto trow = [&](const char* name, double s, double hidden) {
    absl::StrAppendFormat(&out, "  %-20s %12s", name, Ms(s));
    if (hidden > 0)
      absl::StrAppend(&out, "  (", Ms(hidden), " hidden by overlap)");
    absl::StrAppend(&out, "\n");
  };
  trow("GEMMs", t.gemm, 0);
  trow("attention", t.attention, 0);
  trow("elementwise", t.elementwise, 0);
  trow("output layer + loss", t.head, 0);
  trow("recomputation", t.recompute, 0);
  trow("TP communication", t.tp_comm, t.tp_comm_hidden);
  trow("CP communication", t.cp_comm, t.cp_comm_hidden);
  trow("DP communication", t.dp_comm, t.dp_comm_hidden);
  trow("PP communication", t.pp_comm, t.pp_comm_hidden);
  if (job.model.num_experts > 0) trow("EP communication", t.ep_comm, 0);
  trow("pipeline bubble", t.bubble, 0);
  trow("optimizer", t.optimizer, 0);
  if (l.offload_percent > 0) {
    trow("optimizer offload", t.offload, 0);
    absl::StrAppendFormat(
        &out,
        "    (predicted only: host link %.0f GB/s, host AdamW %.0f GB/s, "
        "assumed)\n",
        job.cluster.device.host_link_bandwidth / 1e9,
        job.cluster.device.host_memory_bandwidth / 1e9);
  }
  if (t.core_wait > 0)
    trow("waiting for a core (ranks > cores)", t.core_wait, 0);
  trow("total", t.total(), 0);
  absl::StrAppendFormat(&out, "  MFU %.1f%%, %.0f tokens/s\n", 100 * t.mfu,
                        t.tokens_per_second);
  if (l.pp > 1) absl::StrAppend(&out, FormatStageBalance(job, l, t));
  return out + ProbeDriftNote(job.cluster.device);
}

std::string FormatJson(const JobSpec& job,
                       const std::vector<Prediction>& predictions) {
  nlohmann::json j;
  const gpt::GPTConfig& c = job.model;
  j["model"] = {{"num_layers", c.num_layers},
                {"hidden_size", c.hidden_size},
                {"num_attention_heads", c.num_attention_heads},
                {"num_query_groups", c.query_groups()},
                {"ffn_hidden_size", c.ffn()},
                {"vocab_size", c.vocab_size},
                {"seq_length", c.seq_length},
                {"parameters", ModelParams(c)},
                {"dtype", std::string(DTypeName(job.dtype))}};
  j["global_batch"] = job.global_batch;
  const DeviceSpec& d = job.cluster.device;
  nlohmann::json mix = nlohmann::json::object();  // TP degree -> factor.
  for (const auto& [tp, factor] : d.gemm_mix_factor) {
    mix[std::to_string(tp)] = factor;
  }
  j["cluster"] = {{"device", d.name},
                  {"nodes", job.cluster.nodes},
                  {"devices_per_node", job.cluster.devices_per_node},
                  {"memory_bytes", d.memory_bytes},
                  {"peak_flops", d.PeakFlops(job.dtype)},
                  {"memory_bandwidth", d.memory_bandwidth},
                  {"intra_node_bandwidth", d.intra_node_bandwidth},
                  {"inter_node_bandwidth", d.inter_node_bandwidth},
                  {"intra_node_latency", d.intra_node_latency},
                  {"reduce_bandwidth", d.reduce_bandwidth},
                  {"subgroup_bandwidth", d.subgroup_bandwidth},
                  {"subgroup_reduce_bandwidth", d.subgroup_reduce_bandwidth},
                  {"subgroup_latency", d.subgroup_latency},
                  {"gemm_efficiency", d.gemm_efficiency},
                  {"gemm_small_efficiency", d.gemm_small_efficiency},
                  {"gemm_mix_factor", mix},
                  {"gemm_seconds_per_weight", d.gemm_seconds_per_weight},
                  {"attention_efficiency", d.attention_efficiency},
                  {"prediction_spread", d.prediction_spread},
                  {"probe_drift", d.probe_drift},
                  {"source", d.source}};
  nlohmann::json layouts = nlohmann::json::array();
  for (const Prediction& p : predictions) {
    const MemoryBreakdown& m = p.memory;
    const StepTime& t = p.time;
    const MegatronMemory meg = MegatronTheoreticalMemory(
        job, p.layout, NumMicroBatches(job, p.layout));
    nlohmann::json stages = nlohmann::json::array();
    for (int stage = 0; stage < p.layout.pp; ++stage) {
      stages.push_back(EstimateStageMemory(job, p.layout, stage).total());
    }
    layouts.push_back({{"layout", p.layout.Name()},
                       {"stage_memory", stages},
                       {"fits", p.fits},
                       {"unsupported", p.unsupported},
                       {"memory",
                        {{"stage", m.stage},
                         {"params", m.params},
                         {"weights", m.weights},
                         {"gradients", m.gradients},
                         {"main_weights", m.main_weights},
                         {"optimizer_state", m.optimizer_state},
                         {"activations", m.activations},
                         {"in_flight", m.in_flight},
                         {"peak_at", m.peak_at},
                         {"comm_buffers", m.comm_buffers},
                         {"input_batches", m.input_batches},
                         {"workspace", m.workspace},
                         {"allocator_overhead", m.allocator_overhead},
                         {"host_bytes", m.host_bytes},
                         {"total", m.total()},
                         {"megatron_theoretical", meg.total()},
                         {"megatron_formula_first_stage",
                          MegatronFormulaForFirstStage(
                              job, p.layout, NumMicroBatches(job, p.layout),
                              StageLayerCount(job.model, p.layout, 0))
                              .total()}}},
                       {"time",
                        {{"gemm", t.gemm},
                         {"attention", t.attention},
                         {"elementwise", t.elementwise},
                         {"head", t.head},
                         {"recompute", t.recompute},
                         {"tp_comm", t.tp_comm},
                         {"tp_comm_hidden", t.tp_comm_hidden},
                         {"cp_comm", t.cp_comm},
                         {"cp_comm_hidden", t.cp_comm_hidden},
                         {"dp_comm", t.dp_comm},
                         {"dp_comm_hidden", t.dp_comm_hidden},
                         {"pp_comm", t.pp_comm},
                         {"pp_comm_hidden", t.pp_comm_hidden},
                         {"ep_comm", t.ep_comm},
                         {"bubble", t.bubble},
                         {"optimizer", t.optimizer},
                         {"offload", t.offload},
                         {"core_wait", t.core_wait},
                         {"total", t.total()}}},
                       {"mfu", t.mfu},
                       {"tokens_per_second", t.tokens_per_second}});
  }
  j["layouts"] = layouts;
  return j.dump(2) + "\n";
}

}  // namespace planner
}  // namespace mcc
