#ifndef PARALLEL_PIPELINE_P2P_H_
#define PARALLEL_PIPELINE_P2P_H_

#include <memory>

#include "core/comm/process_group.h"
#include "core/tensor.h"

namespace mcc {
namespace pipeline {

// Point-to-point transfers between neighbouring pipeline stages over the
// pipeline group (group rank = stage). Activations flow to the next stage,
// gradients to the previous one; the last stage's next is stage 0 (and
// stage 0's previous is the last) so that interleaved chunks form a ring.
// Each transfer is tagged with its direction and the receiving chunk, so
// transfers of one kind match in the order they are issued.
class PipelineP2P {
 public:
  explicit PipelineP2P(comm::ProcessGroup* pipeline) : group_(pipeline) {}

  int stage() const { return group_->rank(); }
  int stages() const { return group_->size(); }

  // Activations for chunk `chunk` of the next stage.
  std::shared_ptr<comm::Work> SendForward(const Tensor& t, int chunk);
  // Activations for this stage's chunk `chunk` from the previous stage.
  std::shared_ptr<comm::Work> RecvForward(Tensor* t, int chunk);
  // Gradients for chunk `chunk` of the previous stage.
  std::shared_ptr<comm::Work> SendBackward(const Tensor& t, int chunk);
  // Gradients for this stage's chunk `chunk` from the next stage.
  std::shared_ptr<comm::Work> RecvBackward(Tensor* t, int chunk);

 private:
  int Next() const { return (stage() + 1) % stages(); }
  int Prev() const { return (stage() + stages() - 1) % stages(); }
  comm::ProcessGroup* group_;
};

}  // namespace pipeline
}  // namespace mcc

#endif  // PARALLEL_PIPELINE_P2P_H_
