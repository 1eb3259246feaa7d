#ifndef PARALLEL_PARALLEL_STATE_H_
#define PARALLEL_PARALLEL_STATE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "parallel/rank_layout.h"

namespace mcc {
namespace parallel {

// The process groups of one job, in Megatron's rank order (see
// RankLayout): tensor, pipeline, context, data, data x context, tensor x
// context, model (tensor x pipeline) and embedding (first and last pipeline
// stage). Created collectively from the world group by every rank.
class ParallelState {
 public:
  static absl::StatusOr<std::unique_ptr<ParallelState>> Create(
      std::shared_ptr<comm::ProcessGroup> world, ParallelSizes sizes);

  const RankLayout& layout() const { return layout_; }
  RankCoordinates coordinates() const { return coords_; }

  comm::ProcessGroup* world() const { return world_.get(); }
  comm::ProcessGroup* tensor() const { return tp_.get(); }
  comm::ProcessGroup* pipeline() const { return pp_.get(); }
  comm::ProcessGroup* context() const { return cp_.get(); }
  comm::ProcessGroup* data() const { return dp_.get(); }
  comm::ProcessGroup* data_context() const { return dp_cp_.get(); }
  comm::ProcessGroup* tensor_context() const { return tp_cp_.get(); }
  comm::ProcessGroup* model() const { return mp_.get(); }
  // Null on ranks outside the first and last pipeline stage.
  comm::ProcessGroup* embedding() const { return embedding_.get(); }

  int tensor_rank() const { return coords_.tp; }
  int pipeline_rank() const { return coords_.pp; }
  int data_rank() const { return coords_.dp; }
  int context_rank() const { return coords_.cp; }
  bool is_first_stage() const { return coords_.pp == 0; }
  bool is_last_stage() const {
    return coords_.pp == layout_.pipeline_size() - 1;
  }

  std::string ToString() const;  // Layout and this rank's coordinates.

 private:
  RankLayout layout_;
  RankCoordinates coords_;
  std::shared_ptr<comm::ProcessGroup> world_, tp_, pp_, cp_, dp_, dp_cp_,
      tp_cp_, mp_, embedding_;
};

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_PARALLEL_STATE_H_
