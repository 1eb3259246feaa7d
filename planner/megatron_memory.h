#ifndef PLANNER_MEGATRON_MEMORY_H_
#define PLANNER_MEGATRON_MEMORY_H_

#include "planner/job_spec.h"
#include "planner/layout.h"

namespace mcc {
namespace planner {

// Megatron-LM's theoretical_memory_usage estimate, re-derived from its
// published assumptions (for comparison beside this planner's): bf16
// weights with fp32 gradients, main weights and Adam states (18 bytes a
// parameter, or 6 + 12 / DP under the distributed optimizer) on the most
// loaded shard (the first stage: its layers plus the embedding); and
// activations of Korthikanti et al. 2022 (Table 2) for sequence parallelism
// with selective recomputation, (18 + 4 ffn / h) s b h bytes a layer, for
// the first stage only, which holds PP micro-batches (fewer when the step
// has fewer), times 1 + (PP - 1) / (PP x VP) when interleaved; embedding
// input and dropout; the output layer's and loss's input only without
// pipelining; all divided by TP. It ignores biases, gradient buckets,
// workspace and fragmentation.
struct MegatronMemory {
  double weights_and_optimizer = 0;  // bytes
  double activations = 0;            // bytes
  double total() const { return weights_and_optimizer + activations; }
};
MegatronMemory MegatronTheoreticalMemory(const JobSpec& job,
                                         const Layout& layout,
                                         int num_microbatches);

// Megatron's formula assumes an even split (L / PP layers on the first
// stage, whatever --decoder-first-pipeline-num-layers says). The same
// formula with `first_stage_layers` decoder layers on the first stage (its
// parameters, and that many layers' activations for each of the
// micro-batches in flight), for a layout that sets the split.
MegatronMemory MegatronFormulaForFirstStage(const JobSpec& job,
                                            const Layout& layout,
                                            int num_microbatches,
                                            double first_stage_layers);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_MEGATRON_MEMORY_H_
