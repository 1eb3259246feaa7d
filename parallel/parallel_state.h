#ifndef PARALLEL_PARALLEL_STATE_H_
#define PARALLEL_PARALLEL_STATE_H_

#include <array>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/device.h"
#include "parallel/rank_layout.h"

namespace mcc {
namespace parallel {

// The process groups of one job, in Megatron's rank order (see
// RankLayout): tensor, pipeline, context, data, data x context, tensor x
// context, model (tensor x pipeline) and embedding (first and last pipeline
// stage), and the experts' groups of mixture-of-experts layers: expert model
// (EP), expert tensor (ETP), expert tensor x model and expert data (EDP).
// Created collectively from the world group by every rank; an expert group
// with the same ranks as a dense one (EP 1, ETP = TP: expert tensor is
// tensor, expert data is data x context) is that group, not a new one.
//
// Each group can exist twice, as twins over the same ranks: one moving host
// tensors (gloo: scalars, counts, checkpoint metadata) and one moving the
// job's device tensors (NCCL on a GPU). On the CPU the twins are one group.
// The named accessors return the device twin, the one layers, data
// parallelism, pipelines and optimizers move their tensors over;
// GroupFor picks a twin by a tensor's device.
class ParallelState {
 public:
  // `world` moves host tensors (or, alone, whatever its device is);
  // `device_world` (null: none) the same ranks' device tensors. Both are
  // split alike, collectively.
  static absl::StatusOr<std::unique_ptr<ParallelState>> Create(
      std::shared_ptr<comm::ProcessGroup> world, ParallelSizes sizes,
      std::shared_ptr<comm::ProcessGroup> device_world = nullptr);

  const RankLayout& layout() const { return layout_; }
  RankCoordinates coordinates() const { return coords_; }

  comm::ProcessGroup* world() const { return device(kWorld); }
  comm::ProcessGroup* tensor() const { return device(kTensor); }
  comm::ProcessGroup* pipeline() const { return device(kPipeline); }
  comm::ProcessGroup* context() const { return device(kContext); }
  comm::ProcessGroup* data() const { return device(kData); }
  comm::ProcessGroup* data_context() const { return device(kDataContext); }
  comm::ProcessGroup* tensor_context() const { return device(kTensorContext); }
  comm::ProcessGroup* model() const { return device(kModel); }
  // Null on ranks outside the first and last pipeline stage.
  comm::ProcessGroup* embedding() const { return device(kEmbedding); }
  comm::ProcessGroup* expert_model() const { return device(kExpertModel); }
  comm::ProcessGroup* expert_tensor() const { return device(kExpertTensor); }
  comm::ProcessGroup* expert_tensor_model() const {
    return device(kExpertTensorModel);
  }
  comm::ProcessGroup* expert_data() const { return device(kExpertData); }
  // HSDP (RankLayout::InstanceGroups): this rank's distributed optimizer
  // instance and the ranks holding the same shard in the other instances.
  // Null with one instance.
  comm::ProcessGroup* instance() const {
    return layout_.distributed_optimizer_instances() > 1 ? device(kInstance)
                                                         : nullptr;
  }
  comm::ProcessGroup* cross_instance() const {
    return layout_.distributed_optimizer_instances() > 1
               ? device(kCrossInstance)
               : nullptr;
  }
  // The same over the expert-data-parallel group
  // (RankLayout::ExpertInstanceGroups): where the experts' state is
  // sharded under HSDP, and across. Null with one instance.
  comm::ProcessGroup* expert_instance() const {
    return layout_.distributed_optimizer_instances() > 1
               ? device(kExpertInstance)
               : nullptr;
  }
  comm::ProcessGroup* expert_cross_instance() const {
    return layout_.distributed_optimizer_instances() > 1
               ? device(kExpertCrossInstance)
               : nullptr;
  }

  // The twin of `group` (any group of this state, either twin) that moves
  // tensors on `device`: the one place where a tensor's device picks the
  // backend. Null for null; `group` itself when it is not this state's or
  // no twin moves that device (its collectives then refuse the tensor,
  // naming both devices).
  comm::ProcessGroup* GroupFor(const comm::ProcessGroup* group,
                               Device device) const;

  int tensor_rank() const { return coords_.tp; }
  int pipeline_rank() const { return coords_.pp; }
  int data_rank() const { return coords_.dp; }
  int context_rank() const { return coords_.cp; }
  ExpertCoordinates expert_coordinates() const { return expert_coords_; }
  bool is_first_stage() const { return coords_.pp == 0; }
  bool is_last_stage() const {
    return coords_.pp == layout_.pipeline_size() - 1;
  }

  std::string ToString() const;  // Layout and this rank's coordinates.

 private:
  enum Kind {
    kWorld,
    kTensor,
    kPipeline,
    kContext,
    kData,
    kDataContext,
    kTensorContext,
    kModel,
    kEmbedding,
    kExpertModel,
    kExpertTensor,
    kExpertTensorModel,
    kExpertData,
    kInstance,
    kCrossInstance,
    kExpertInstance,
    kExpertCrossInstance,
    kNumKinds
  };
  struct Twins {
    std::shared_ptr<comm::ProcessGroup> host, device;
  };
  comm::ProcessGroup* device(Kind kind) const {
    return groups_[kind].device.get();
  }

  RankLayout layout_;
  RankCoordinates coords_;
  ExpertCoordinates expert_coords_;
  std::array<Twins, kNumKinds> groups_;
};

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_PARALLEL_STATE_H_
