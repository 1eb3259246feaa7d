#include "parallel/context_parallel/chunk_layout.h"

#include "absl/strings/str_cat.h"
#include "core/ops/layout.h"
#include "core/status_macros.h"

namespace mcc {
namespace context_parallel {

absl::StatusOr<ChunkLayout> ChunkLayout::Create(int context_size,
                                                int context_rank,
                                                int64_t seq_length) {
  if (context_size < 1 || context_rank < 0 || context_rank >= context_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("context parallelism: rank ", context_rank,
                     " is not in a group of size ", context_size));
  }
  if (seq_length <= 0 || seq_length % (2 * context_size) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context parallelism: sequence length ", seq_length,
        " must split into 2 x context-parallel size = ", 2 * context_size,
        " equal chunks"));
  }
  ChunkLayout layout;
  layout.size_ = context_size;
  layout.rank_ = context_rank;
  layout.seq_ = seq_length;
  return layout;
}

int64_t ChunkLayout::GlobalPosition(int64_t t) const {
  const int64_t l = chunk_length();
  return GlobalChunk(static_cast<int>(t / l)) * l + t % l;
}

absl::StatusOr<Tensor> ChunkLayout::SliceSequence(const Tensor& full) const {
  if (full.dim() != 2 || full.size(1) != seq_) {
    return absl::InvalidArgumentError(
        absl::StrCat("context parallelism: ", full.Describe(),
                     " is not [batch, ", seq_, "] (", ToString(), ")"));
  }
  if (size_ == 1) return full;
  const int64_t b = full.size(0), l = chunk_length();
  Tensor local = Tensor::Empty({b, 2 * l}, full.dtype(), full.device());
  for (int c = 0; c < 2; ++c) {
    ops::StridedCopyPlan plan;
    plan.rank = 2;
    plan.shape[0] = b;
    plan.shape[1] = l;
    plan.src_strides[0] = seq_;
    plan.src_strides[1] = 1;
    plan.dst_strides[0] = 2 * l;
    plan.dst_strides[1] = 1;
    plan.src_offset = GlobalChunk(c) * l;
    plan.dst_offset = c * l;
    MCC_RETURN_IF_ERROR(ops::CopyStrided(full, plan, &local));
  }
  return local;
}

std::string ChunkLayout::ToString() const {
  return absl::StrCat("CP rank ", rank_, " of ", size_, ": chunks ",
                      GlobalChunk(0), ", ", GlobalChunk(1), " of ",
                      chunk_length(), " tokens");
}

}  // namespace context_parallel
}  // namespace mcc
