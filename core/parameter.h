#ifndef CORE_PARAMETER_H_
#define CORE_PARAMETER_H_

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mcc {

// A trainable tensor with what the optimizer, data parallelism and
// checkpoints need to know about it.
//
// `value` holds the weights in the training dtype (fp32, bf16 or fp16);
// `main_grad` is an fp32 buffer the backward accumulates into (Megatron's
// gradient-accumulation fusion), possibly a view into a data-parallel
// bucket. How the local tensor maps onto the full (unsharded) one is recorded
// so checkpoints can reshard and gradient norms count each element once.
struct Parameter {
  // Global name, e.g. "decoder.layers.0.mlp.linear_fc1.weight".
  std::string name;
  Tensor value;
  Tensor main_grad;
  Shape global_shape;        // Shape of the full tensor across TP ranks.
  int partition_dim = -1;    // Dimension split across TP ranks, -1 if none.
  int partition_rank = 0;    // This rank's index along that split.
  int partition_count = 1;   // Number of pieces along that split.
  bool weight_decay = true;  // False for biases and norm weights.
  // Replicated across TP but its gradient differs per rank under sequence
  // parallelism (norm weights, biases of row-parallel layers): the gradient
  // is all-reduced over TP before use.
  bool sequence_parallel = false;
  // Also held by another rank's parameter (the tied word embedding on the
  // first and last pipeline stage); counted once in norms and checkpoints.
  bool shared_with_other_stage = false;
  // The other copy of a shared parameter sits on the same pipeline rank
  // (ZB-V's V puts the embeddings and the output layer both on stage 0):
  // this one (the output layer's) is left out of the gradient norm.
  bool norm_counted_by_other_copy = false;
  // Global rows of dimension 0 that belong to the model; the rows after them
  // pad the tensor for an even split over TP (the padded vocabulary). They
  // stay zero, take no gradient and are left out of checkpoints, so the
  // padding never changes the model. -1: no padding.
  int64_t unpadded_rows = -1;

  // An expert weight of a mixture-of-experts layer laid out over the
  // experts' ranks (models/moe): split over the expert-model-parallel group
  // (partition_* above, dimension 0) and, with expert_tensor_count > 1, over
  // the expert-tensor-parallel group along expert_tensor_dim in
  // expert_tensor_blocks equal blocks (SwiGLU's gate and up: 2), each block
  // split alike. Replicated over the expert-data-parallel group only: data
  // parallelism reduces its gradient there, and gradient norms count it on
  // every rank of the expert-model x expert-tensor group.
  bool expert_parallel = false;
  int expert_tensor_dim = -1;
  int expert_tensor_rank = 0;
  int expert_tensor_count = 1;
  int expert_tensor_blocks = 1;

  bool is_tensor_parallel() const { return partition_dim >= 0; }
  // The global rows of dimension 0 that checkpoints hold.
  int64_t model_rows() const {
    return unpadded_rows >= 0 ? unpadded_rows : global_shape.at(0);
  }
};

using ParameterList = std::vector<std::shared_ptr<Parameter>>;

}  // namespace mcc

#endif  // CORE_PARAMETER_H_
