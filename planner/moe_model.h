#ifndef PLANNER_MOE_MODEL_H_
#define PLANNER_MOE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "models/gpt/gpt_config.h"
#include "planner/job_spec.h"
#include "planner/layout.h"

namespace mcc {
namespace planner {

// The mixture-of-experts part of the planner's memory and step-time model
// (issue 41). A layer that moe_layer_freq picks holds, in place of the
// dense MLP, a router [E, h] (replicated), the rank's E / EP experts with
// their ffn (moe_ffn) split over ETP, and a shared expert split over TP, as
// Megatron-Core lays them out. Every function is a no-op (zeros) for a
// dense model, so the dense model's figures stay exactly what they were.
//
// Load imbalance, the one thing the shapes do not give: the busiest rank's
// expert rows against the mean.
//  - With --moe-expert-capacity-factor c each expert takes at most
//    ceil(tokens x topk / E x c) slots from each rank, so the busiest rank
//    computes at most E x capacity rows: the factor bounds it (c, rounded).
//  - Dropless, one rank (EP 1) computes every slot: no imbalance.
//  - Dropless under EP > 1 nothing bounds it: JobSpec's
//    moe_dropless_imbalance (max / mean over the EP ranks) is assumed.

// ETP as used: the layout's, or TP's when unset (Megatron's default).
int ExpertTensorParallel(const Layout& l);
// The expert-data-parallel size, world / (ETP x EP x PP): the ranks over
// which the experts' gradients are reduced and their optimizer state is
// sharded (Megatron's expert rank generator; parallel/rank_layout.h).
int ExpertDataParallel(const Layout& l);

// MoE layers among the global layers [first, first + count).
int MoeLayersIn(const gpt::GPTConfig& c, int first, int count);
// MoE layers held by pipeline rank `stage` (its layers by the layout's
// split, planner/stage_layers.h), and the most any stage holds.
int MoeLayersOnStage(const gpt::GPTConfig& c, const Layout& l, int stage);
int MostMoeLayersOnAStage(const gpt::GPTConfig& c, const Layout& l);

// Parameter elements one rank holds in one MoE layer's MLP place, and the
// dense MLP (fc1, fc2, their biases) it replaces.
struct MoeLayerParams {
  int64_t router = 0;
  int64_t experts = 0;  // E / EP experts, each fc1 and fc2 / ETP
  int64_t shared = 0;   // The shared expert / TP
  int64_t dense_mlp = 0;
  int64_t delta() const { return router + experts + shared - dense_mlp; }
};
MoeLayerParams MoeParamsPerRank(const gpt::GPTConfig& c, int tp, int ep,
                                int etp);
// The whole model's change in parameters against its dense form (TP 1,
// EP 1): for ModelParams.
int64_t MoeModelParamsDelta(const gpt::GPTConfig& c);

// A stage's MoE parameters: what is added to the dense count and, of that
// rank's parameters, the expert elements (reduced and sharded over EDP
// rather than DP x CP).
struct MoeStageParams {
  int layers = 0;
  int64_t delta = 0;
  int64_t experts = 0;
};
MoeStageParams MoeParamsOnStage(const JobSpec& job, const Layout& l, int stage);

// The busiest rank's rows through its experts against the mean slot count
// (tokens x topk): see the assumption above.
double MoeImbalance(const JobSpec& job, const Layout& l);

// One MoE layer, one micro-batch, on this rank, whose layer input holds
// the micro-batch's tokens after CP (/ TP under SP).
struct MoeLayerWork {
  double slots = 0;              // tokens x topk (permuted rows)
  double expert_rows = 0;        // Rows the busiest rank's experts compute
  double rows_per_expert = 0;    // Its grouped GEMM's rows per expert
  double expert_weights = 0;     // One local expert's fc1 + fc2 elements
  double local_experts = 0;      // E / EP
  double shared_weights = 0;     // Shared expert fc1 + fc2 elements here
  double router_weights = 0;     // E x h
  double dense_mlp_weights = 0;  // The dense MLP's fc1 + fc2 here (replaced)
  // Activation record bytes held from the forward to the backward, and
  // the dense MLP's (fc1 output, fc2 input) they replace.
  double record_bytes = 0;
  double dense_record_bytes = 0;
  // The backward's transient gradients of the layer's MLP part.
  double backward_bytes = 0;
  // Memory-bound bytes a forward moves beyond the GEMMs (router scores,
  // permute and unpermute, the activation on the expert rows), less the
  // dense MLP's activation.
  double elementwise_bytes = 0;
  // Bytes this rank sends to the other EP ranks in one all-to-all
  // (dispatch or combine); a step runs four per layer and micro-batch
  // (dispatch and combine, forward and backward). 0 at EP 1.
  double all_to_all_bytes = 0;
  // Rows gathered over (and partial outputs scattered back over) the ETP
  // ranks under sequence parallelism, in bytes, per collective; 0 at ETP 1.
  double etp_bytes = 0;
};
MoeLayerWork MoeWork(const JobSpec& job, const Layout& l);

// The EP sizes a layout search tries: {1} for a dense model, else the
// divisors of the experts that divide a stage's `stage_ranks`.
std::vector<int> ExpertParallelSizes(const gpt::GPTConfig& c, int stage_ranks);
// A searched layout of a mixture of experts as train runs it: EP `ep`, the
// experts whole (ETP 1), SP as the search set it (beside TP each TP rank
// then routes its own tokens). Nothing for a dense model.
void SetMoeSearchDefaults(const gpt::GPTConfig& c, int ep, Layout* l);

// One line for tools/plan --explain: the experts, their layout, the
// imbalance taken and why, the all-to-all volume; "" for a dense model.
std::string DescribeMoe(const JobSpec& job, const Layout& l);

// Experts per EP, ETP x EP x PP dividing the world: what the layout must
// satisfy for a mixture of experts; an error names the part at fault.
absl::Status CheckMoeLayout(const JobSpec& job, const Layout& l);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_MOE_MODEL_H_
