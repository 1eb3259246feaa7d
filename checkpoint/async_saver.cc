#include "checkpoint/async_saver.h"

#include "core/status_macros.h"

namespace mcc {

AsyncCheckpointSaver::~AsyncCheckpointSaver() { (void)Wait(); }

absl::Status AsyncCheckpointSaver::Wait() {
  if (thread_.joinable()) thread_.join();
  return status_;
}

absl::Status AsyncCheckpointSaver::Start(
    const std::string& dir, int64_t iteration,
    const std::vector<ShardedTensorRef>& tensors,
    const checkpoint::CommonState& common,
    const checkpoint::RankState& rank_state, const DistContext& dist,
    const SaveOptions& options) {
  const absl::Status previous = Wait();
  status_ = absl::OkStatus();
  // Snapshot: copy every shard to a host buffer now, so training may change
  // the originals as soon as this returns.
  std::vector<ShardedTensorRef> host(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ShardedTensorRef& src = tensors[i];
    MCC_RETURN_IF_ERROR(src.Validate());
    ShardedTensorRef& dst = host[i];
    dst.name = src.name;
    dst.global_shape = src.global_shape;
    dst.global_offsets = src.global_offsets;
    if (i < host_.size() && host_[i].local.shape() == src.local.shape() &&
        host_[i].local.dtype() == src.local.dtype()) {
      dst.local = host_[i].local;
    } else {
      dst.local = Tensor::Empty(src.local.shape(), src.local.dtype());
    }
    MCC_RETURN_IF_ERROR(dst.local.CopyFrom(src.local));
  }
  host_ = host;
  iteration_ = iteration;
  thread_ = std::thread([this, dir, iteration, host = std::move(host), common,
                         rank_state, dist, options] {
    status_ =
        SaveCheckpoint(dir, iteration, host, common, rank_state, dist, options);
  });
  return previous;
}

}  // namespace mcc
