#include "checkpoint/in_process_group.h"

namespace mcc {

InProcessGroup::InProcessGroup(int world_size)
    : world_size_(world_size), slots_(world_size) {}

std::vector<std::string> InProcessGroup::AllGather(int rank,
                                                   const std::string& mine) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t gen = generation_;
  slots_[rank] = mine;
  if (++arrived_ == world_size_) {
    result_ = slots_;
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return result_;
  }
  cv_.wait(lock, [&] { return generation_ != gen; });
  // result_ stays valid until the next round completes, which needs this
  // thread to arrive again.
  return result_;
}

DistContext InProcessGroup::Context(int rank) {
  DistContext ctx;
  ctx.rank = rank;
  ctx.world_size = world_size_;
  ctx.barrier = [this, rank] {
    AllGather(rank, "");
    return absl::OkStatus();
  };
  ctx.all_gather =
      [this, rank](
          const std::string& mine) -> absl::StatusOr<std::vector<std::string>> {
    return AllGather(rank, mine);
  };
  return ctx;
}

}  // namespace mcc
