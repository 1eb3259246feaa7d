#include "planner/moe_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gpt/moe_layer_pattern.h"
#include "planner/stage_layers.h"

namespace mcc {
namespace planner {
namespace {

// fc1's outputs for an ffn of f: gate and up under SwiGLU.
int64_t Fc1Outputs(const gpt::GPTConfig& c, int64_t f) {
  return c.activation == gpt::Activation::kSwiGLU ? 2 * f : f;
}

// Tokens of a micro-batch on this rank after CP, and the rows the MoE
// layer's input holds here (/ TP under SP).
double Tokens(const JobSpec& job, const Layout& l) {
  return static_cast<double>(l.micro_batch) * job.model.seq_length / l.cp;
}
double LayerRows(const JobSpec& job, const Layout& l) {
  return l.sequence_parallel ? Tokens(job, l) / l.tp : Tokens(job, l);
}

// Rows gathered over the ETP ranks before the experts: their tokens differ
// only under SP (without it every TP rank holds the same tokens).
int EtpGather(const Layout& l) {
  return l.sequence_parallel ? ExpertTensorParallel(l) : 1;
}

// The busiest rank's expert rows before the ETP gather, for `slots`
// permuted rows on each rank.
double BusiestRows(const JobSpec& job, const Layout& l, double slots) {
  const gpt::GPTConfig& c = job.model;
  const double experts = c.num_experts;
  const double cf = c.moe_expert_capacity_factor;
  if (cf > 0) {
    // models/moe/token_drop.h: ceil(tokens x topk / E x factor) per expert
    // and source rank; the busiest rank's E / EP experts take at most that
    // from each of the EP ranks.
    const double capacity = std::ceil(slots / experts * cf);
    return std::min(experts * capacity, slots * l.ep);
  }
  if (l.ep == 1) return slots;
  return slots * std::min<double>(job.moe_dropless_imbalance, l.ep);
}

}  // namespace

int ExpertTensorParallel(const Layout& l) { return l.etp > 0 ? l.etp : l.tp; }

int ExpertDataParallel(const Layout& l) {
  const int per_stage = l.world() / l.pp;
  return std::max(1, per_stage / (ExpertTensorParallel(l) * l.ep));
}

int MoeLayersIn(const gpt::GPTConfig& c, int first, int count) {
  if (c.num_experts <= 0) return 0;
  // Parsed once (IsMoeLayer parses the pattern on every call).
  auto pattern = gpt::ParseMoeLayerFreq(c.moe_layer_freq, c.num_layers);
  if (!pattern.ok()) return 0;
  int n = 0;
  for (int i = std::max(0, first); i < std::min(first + count, c.num_layers);
       ++i) {
    n += (*pattern)[i] ? 1 : 0;
  }
  return n;
}

int MoeLayersOnStage(const gpt::GPTConfig& c, const Layout& l, int stage) {
  if (c.num_experts <= 0) return 0;
  int n = 0;
  for (const pipeline::LayerRange& r : StageLayerRanges(c, l, stage)) {
    n += MoeLayersIn(c, r.first, r.count);
  }
  return n;
}

int MostMoeLayersOnAStage(const gpt::GPTConfig& c, const Layout& l) {
  int most = 0;
  for (int s = 0; s < l.pp; ++s)
    most = std::max(most, MoeLayersOnStage(c, l, s));
  return most;
}

MoeLayerParams MoeParamsPerRank(const gpt::GPTConfig& c, int tp, int ep,
                                int etp) {
  MoeLayerParams p;
  if (c.num_experts <= 0) return p;
  const int64_t h = c.hidden_size, f = c.ffn(), fm = c.moe_ffn();
  const int64_t fs = c.moe_shared_expert_intermediate_size;
  const int64_t bias = c.add_bias_linear ? 1 : 0;
  p.router = c.num_experts * h;
  p.experts = c.num_experts / ep * (Fc1Outputs(c, fm) + fm) * h / etp;
  p.shared = (Fc1Outputs(c, fs) + fs) * h / tp;
  p.dense_mlp =
      (Fc1Outputs(c, f) + f) * h / tp + bias * (Fc1Outputs(c, f) / tp + h);
  return p;
}

int64_t MoeModelParamsDelta(const gpt::GPTConfig& c) {
  return MoeLayersIn(c, 0, c.num_layers) * MoeParamsPerRank(c, 1, 1, 1).delta();
}

MoeStageParams MoeParamsOnStage(const JobSpec& job, const Layout& l,
                                int stage) {
  MoeStageParams s;
  s.layers = MoeLayersOnStage(job.model, l, stage);
  const MoeLayerParams p =
      MoeParamsPerRank(job.model, l.tp, l.ep, ExpertTensorParallel(l));
  s.delta = s.layers * p.delta();
  s.experts = s.layers * p.experts;
  return s;
}

double MoeImbalance(const JobSpec& job, const Layout& l) {
  if (job.model.num_experts <= 0) return 1;
  const double slots = LayerRows(job, l) * job.model.moe_router_topk;
  return BusiestRows(job, l, slots) / slots;
}

MoeLayerWork MoeWork(const JobSpec& job, const Layout& l) {
  MoeLayerWork w;
  const gpt::GPTConfig& c = job.model;
  if (c.num_experts <= 0) return w;
  const double e = static_cast<double>(DTypeSize(job.dtype));
  const double T = Tokens(job, l), Tm = LayerRows(job, l);
  const double h = static_cast<double>(c.hidden_size);
  const double E = c.num_experts, k = c.moe_router_topk;
  const int etp = ExpertTensorParallel(l);
  const double t = l.tp;
  const double f = static_cast<double>(c.ffn());
  const double f1 = static_cast<double>(Fc1Outputs(c, c.ffn()));
  // One rank's slice of an expert's ffn and of the shared expert's.
  const double fm = static_cast<double>(c.moe_ffn()) / etp;
  const double f1m = static_cast<double>(Fc1Outputs(c, c.moe_ffn())) / etp;
  const double fs =
      static_cast<double>(c.moe_shared_expert_intermediate_size) / t;
  const double f1s = static_cast<double>(
                         Fc1Outputs(c, c.moe_shared_expert_intermediate_size)) /
                     t;

  w.slots = Tm * k;
  const double received = BusiestRows(job, l, w.slots);
  w.expert_rows = received * EtpGather(l);
  w.local_experts = E / l.ep;
  w.rows_per_expert = w.expert_rows / w.local_experts;
  w.expert_weights = (f1m + fm) * h;
  w.shared_weights = (f1s + fs) * h;
  w.router_weights = E * h;
  w.dense_mlp_weights = (f1 + f) * h / t;

  // models/moe/moe_mlp.h's Activations: the fp32 copy of the input (not
  // under fp32), router logits and scores (fp32), top-k indices (int32) and
  // weights (fp32), the two sort maps (int32), the permuted input and the
  // combined expert output, the experts' fc1 and activation outputs over
  // their rows, the shared expert's; the dispatched input where EP or the
  // ETP gather copies it; the dropping weights under a capacity factor; the
  // fp32 aux and z losses.
  double record = (e != 4 ? Tm * h * 4 : 0) + 2 * Tm * E * 4 + 2 * w.slots * 4 +
                  2 * w.slots * 4 + 2 * w.slots * h * e +
                  w.expert_rows * (f1m + fm) * e + Tm * (f1s + fs) * e;
  if (l.ep > 1 || EtpGather(l) > 1) record += w.expert_rows * h * e;
  if (c.moe_expert_capacity_factor > 0) record += w.slots * 4;
  const bool aux =
      c.moe_router_load_balancing_type != gpt::MoeLoadBalancing::kNone &&
      c.moe_aux_loss_coeff > 0;
  record += (aux ? 4 : 0) + (c.moe_z_loss_coeff > 0 ? 4 : 0);
  w.record_bytes = record;
  w.dense_record_bytes = T * (f1 + f) / t * e;
  // Backward: the combined output's and permuted input's gradients, the
  // experts' fc1 and activation gradients, the fp32 input gradient sum, the
  // router's fp32 logit and score gradients, the shared expert's.
  w.backward_bytes = 2 * w.slots * h * e + w.expert_rows * (f1m + fm) * e +
                     Tm * h * 4 + 2 * Tm * E * 4 + Tm * (f1s + fs) * e;
  // Forward traffic beyond the GEMMs: scores written, read by softmax and
  // top-k and written again (fp32); permute and unpermute each read and
  // write the slots and unpermute writes the output; the activations.
  w.elementwise_bytes = 4 * Tm * E * 4 + 2 * w.slots * h * e +
                        (w.slots + Tm) * h * e +
                        w.expert_rows * (f1m + fm) * e + Tm * (f1s + fs) * e +
                        (e != 4 ? Tm * h * (e + 4) : 0) - T * (f1 + f) / t * e;
  if (l.ep > 1) w.all_to_all_bytes = received * h * e * (l.ep - 1) / l.ep;
  if (EtpGather(l) > 1) w.etp_bytes = w.expert_rows * h * e;
  return w;
}

std::vector<int> ExpertParallelSizes(const gpt::GPTConfig& c, int stage_ranks) {
  if (c.num_experts <= 0) return {1};
  std::vector<int> sizes;
  for (int ep = 1; ep <= c.num_experts; ++ep) {
    if (c.num_experts % ep == 0 && stage_ranks % ep == 0) sizes.push_back(ep);
  }
  return sizes;
}

void SetMoeSearchDefaults(const gpt::GPTConfig& c, int ep, Layout* l) {
  if (c.num_experts <= 0) return;
  l->ep = ep;
  l->etp = 1;
}

std::string DescribeMoe(const JobSpec& job, const Layout& l) {
  const gpt::GPTConfig& c = job.model;
  if (c.num_experts <= 0) return "";
  const MoeLayerWork w = MoeWork(job, l);
  const MoeStageParams first = MoeParamsOnStage(job, l, 0);
  std::string why;
  if (c.moe_expert_capacity_factor > 0) {
    why = absl::StrFormat("bounded by capacity factor %g",
                          c.moe_expert_capacity_factor);
  } else if (l.ep == 1) {
    why = "dropless, one rank holds every expert";
  } else {
    why = absl::StrFormat("dropless: assumed max/mean %g over the EP ranks",
                          job.moe_dropless_imbalance);
  }
  return absl::StrFormat(
      "mixture of experts: %d experts, top-%d, ffn %d, shared expert %d, on "
      "%d of %d layers; EP %d, ETP %d, expert data parallel %d; %d expert "
      "parameters on stage 0's ranks; busiest rank's expert rows %.3gx the "
      "mean (%s); all-to-all %.3g MiB each way a layer and micro-batch\n",
      c.num_experts, c.moe_router_topk, c.moe_ffn(),
      c.moe_shared_expert_intermediate_size, MoeLayersIn(c, 0, c.num_layers),
      c.num_layers, l.ep, ExpertTensorParallel(l), ExpertDataParallel(l),
      first.experts, MoeImbalance(job, l), why, w.all_to_all_bytes / (1 << 20));
}

absl::Status CheckMoeLayout(const JobSpec& job, const Layout& l) {
  const gpt::GPTConfig& c = job.model;
  auto bad = [&](auto... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", l.Name(), ": ", parts...));
  };
  if (l.ep < 1 || l.etp < 0) return bad("EP and ETP must be positive");
  if (c.num_experts <= 0) {
    if (l.ep > 1) {
      return bad("expert parallelism (EP ", l.ep,
                 ") needs a mixture of experts (--num-experts)");
    }
    return absl::OkStatus();
  }
  if (c.num_experts % l.ep != 0) {
    return bad("EP ", l.ep, " does not divide the ", c.num_experts, " experts");
  }
  const int etp = ExpertTensorParallel(l);
  if (c.moe_ffn() % etp != 0) {
    return bad("ETP ", etp, " does not divide the experts' ffn ", c.moe_ffn());
  }
  const int per_stage = l.world() / l.pp;
  if (per_stage % (etp * l.ep) != 0) {
    return bad("ETP x EP = ", etp * l.ep, " does not divide the ", per_stage,
               " ranks of a pipeline stage (TP x DP x CP)");
  }
  return absl::OkStatus();
}

}  // namespace planner
}  // namespace mcc
