#ifndef PARALLEL_FSDP_CHECKPOINT_INTEROP_H_
#define PARALLEL_FSDP_CHECKPOINT_INTEROP_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/data_parallel.h"

namespace mcc {
namespace fsdp {

// Whole TP-local tensors keyed as the training checkpoint names them:
// "<param>" (model dtype) and "optimizer.<state>.<param>" (fp32). Always
// host (CPU) tensors: on another device, gathering reads each tensor
// through one explicit copy to the host and scattering writes it back
// through one copy (checkpoint I/O, not the training step).
using TrainingTensors = std::map<std::string, Tensor>;

// The parameters and optimizer state of any data-parallel layout made
// whole: FSDP's parameters gathered, sharded state all-gathered over `dp`
// (as training/checkpointing saves them), so a layout without FSDP can
// load them and the other way round. fsdp and dp may be null (a plain
// model and optimizer). Collective over dp, or over the optimizer's shard
// group where it has one (an instance under HSDP); expert weights'
// (expert_parallel) state over the optimizer's expert shard group.
absl::StatusOr<TrainingTensors> GatherTrainingTensors(
    const ParameterList& params, data_parallel::DataParallel* fsdp,
    optim::Optimizer* optimizer, comm::ProcessGroup* dp);

// Loads whole tensors into this layout: parameters (into FSDP's fp32 main
// shards), then each optimizer state piece from its range of the whole
// state. Errors name the missing or mis-shaped tensor. Collective over the
// FSDP group when fsdp is given.
absl::Status ScatterTrainingTensors(const TrainingTensors& tensors,
                                    const ParameterList& params,
                                    data_parallel::DataParallel* fsdp,
                                    optim::Optimizer* optimizer);

}  // namespace fsdp
}  // namespace mcc

#endif  // PARALLEL_FSDP_CHECKPOINT_INTEROP_H_
