#ifndef PLANNER_STEP_TIME_MODEL_H_
#define PLANNER_STEP_TIME_MODEL_H_

#include "planner/job_spec.h"
#include "planner/layout.h"

namespace mcc {
namespace planner {

// Seconds of one training step on the slowest pipeline stage, by part.
// Compute parts are for the whole step (every micro-batch, forward and
// backward, recomputation included); communication parts are what is
// exposed, with what overlap hides listed beside.
struct StepTime {
  double gemm = 0;            // QKV, projection, MLP
  double attention = 0;       // Flash attention forward and backward
  double elementwise = 0;     // Norms, activations, adds, copies (memory-bound)
  double head = 0;            // Output layer GEMMs and cross entropy
  double recompute = 0;       // Extra forward work of recomputation
  double tp_comm = 0;         // Exposed TP collectives
  double tp_comm_hidden = 0;  // Behind GEMMs (job.overlap_tp_comm)
  double cp_comm = 0;         // Exposed part of the ring exchange of K and V
  double cp_comm_hidden = 0;
  double dp_comm = 0;  // Exposed gradient reduction / parameter gather
  double dp_comm_hidden = 0;
  double pp_comm = 0;  // Exposed pipeline transfers
  double pp_comm_hidden = 0;
  // Mixture of experts: the EP all-to-alls (dispatch and combine, forward
  // and backward) and the ETP row gathers, exposed (planner/moe_model.h).
  double ep_comm = 0;
  double bubble = 0;     // Pipeline fill and drain
  double optimizer = 0;  // Grad norm, clip and the update (memory-bound)
  // Optimizer offload: the host share's gradient and parameter copies over
  // the host link and its CPU AdamW, beyond what the device's share of the
  // update hides (predicted only; DeviceSpec's host figures are assumed).
  double offload = 0;
  // Ranks that outnumber the cores (CPU) time-share them: the time the
  // node's compute needs beyond the rank's own schedule.
  double core_wait = 0;
  double total() const {
    return gemm + attention + elementwise + head + recompute + tp_comm +
           cp_comm + dp_comm + pp_comm + ep_comm + bubble + optimizer +
           offload + core_wait;
  }
  // What balancing the pipeline stages weighs (stage_balance.h), per
  // micro-batch, forward and backward: one decoder layer (its compute,
  // recomputation and exposed TP communication), the output layer and loss
  // (last stage), and the embedding lookup and its gradient (first stage).
  // Already inside the totals above; not added again.
  double layer_mb = 0;
  double head_mb = 0;
  double embedding_mb = 0;
  // Of those, what a schedule that splits the backward (ZB-H1) runs as the
  // weight-gradient step W: a layer's and the output layer's weight GEMMs
  // (0 when the layout's schedule does not split).
  double layer_weight_mb = 0;
  double head_weight_mb = 0;
  double model_flops = 0;  // Per step, all ranks (for MFU)
  double mfu = 0;          // model_flops / (total x world x peak)
  double tokens_per_second = 0;
};

// The layout must pass CheckLayout.
StepTime EstimateStepTime(const JobSpec& job, const Layout& layout);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_STEP_TIME_MODEL_H_
