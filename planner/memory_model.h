#ifndef PLANNER_MEMORY_MODEL_H_
#define PLANNER_MEMORY_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "planner/job_spec.h"
#include "planner/layout.h"

namespace mcc {
namespace planner {

// Peak bytes one rank of a pipeline stage holds, by kind, derived from what
// this project allocates: models/gpt's activation records, DDP's fp32
// gradient buffer, the optimizer's fp32 main weights and states, FSDP's
// shards and gathered units, the pipeline's micro-batches in flight.
struct MemoryBreakdown {
  int stage = 0;            // Pipeline rank.
  int64_t params = 0;       // Parameter elements of this TP/PP rank.
  double weights = 0;       // Model dtype (ZeRO-3: shard + gathered units).
  double gradients = 0;     // fp32 main_grad (ZeRO-2/3: shard + in-flight).
  double main_weights = 0;  // fp32 master copies the optimizer owns.
  double optimizer_state = 0;
  double activations = 0;   // Records of the micro-batches in flight.
  double comm_buffers = 0;  // Pipeline transfers, gather/scatter buffers.
  double workspace = 0;     // Transients of the step at the peak.
  // The step's micro-batches as the data loader made them (token ids,
  // labels, loss mask), held until the next step's arrive, and, where the
  // device's memory is the host's (the CPU), the loader's prefetched ones.
  double input_batches = 0;
  double allocator_overhead = 0;
  // The offloaded share of main weights and optimizer state, in pinned host
  // memory (not in total()).
  double host_bytes = 0;
  int in_flight = 0;  // Most micro-batch records held at once (chunks).
  // When the peak falls: "the schedule" (a forward or backward), "the
  // gradient reduction" (activations freed) or "DDP's setup" (before the
  // first step).
  std::string peak_at = "the schedule";
  double total() const {
    return weights + gradients + main_weights + optimizer_state + activations +
           comm_buffers + workspace + input_batches + allocator_overhead;
  }
};

// Bytes one transformer layer's activation record holds for one
// micro-batch of `micro_batch` sequences (TransformerLayer::Activations):
// norm inputs and statistics, every linear layer's input, q/k/v, the
// attention output and its log-sum-exp (dropped under selective
// recomputation) and the first MLP projection's output.
double LayerActivationBytes(const JobSpec& job, const Layout& layout);

// Bytes one micro-batch's record of a model chunk of `layers` layers holds
// between its forward and backward (ChunkRecord): the layers' records (under
// full recomputation only the recomputed chunks' inputs), the token ids and
// positions on the first chunk (pre), the head's norm, output-layer and
// cross-entropy records on the last (post).
// `first_layer`: the chunk's first global layer (which layers are MoE).
double ChunkRecordBytes(const JobSpec& job, const Layout& layout, int layers,
                        bool pre, bool post, int first_layer = 0);

// Bytes a micro-batch of a model chunk keeps from its input-gradient step
// (B) to its weight-gradient step (W) when the schedule splits them: each
// linear layer's output gradient and input (the column-parallel input
// gathered under SP), a row-parallel bias's ungathered gradient under SP,
// the embeddings' gradient, token ids and positions (pre), the logits'
// gradient and the output layer's input (post).
double WeightGradRecordBytes(const JobSpec& job, const Layout& layout,
                             int layers, bool pre, bool post);

// Checks that the layout divides the job (world, layers over stages and
// virtual stages, heads and groups over TP, batch over micro-batches and
// DP, the interleaved schedule's micro-batch multiple); the error says what
// does not divide.
absl::Status CheckLayout(const JobSpec& job, const Layout& layout);
int NumMicroBatches(const JobSpec& job, const Layout& layout);

// One rank of pipeline stage `stage`; the layout must pass CheckLayout.
MemoryBreakdown EstimateStageMemory(const JobSpec& job, const Layout& layout,
                                    int stage);
// The stage with the largest total (the rank that runs out first).
absl::StatusOr<MemoryBreakdown> EstimatePeakMemory(const JobSpec& job,
                                                   const Layout& layout);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_MEMORY_MODEL_H_
