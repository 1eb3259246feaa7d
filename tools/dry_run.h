#ifndef TOOLS_DRY_RUN_H_
#define TOOLS_DRY_RUN_H_

#include "tools/plan_job.h"

namespace mcc {
namespace tools {

// train --dry-run: predicts, from the flags alone and before any process
// group forms or any tensor is allocated, the memory of every pipeline
// stage's ranks and the step time of the requested layout on this machine's
// CPUs (measured now, shared by the local ranks), prints them (rank 0 only)
// and warns naming each stage whose ranks will not fit. Returns the exit
// code: 0 when every rank fits, 1 when one will not, 2 for flags the model
// cannot take.
int DryRun(const training::TrainConfig& config, const TrainSettings& settings,
           int world_size);

}  // namespace tools
}  // namespace mcc

#endif  // TOOLS_DRY_RUN_H_
