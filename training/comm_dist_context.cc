#include "training/comm_dist_context.h"

#include <cstring>

#include "core/status_macros.h"

namespace mcc {
namespace training {

DistContext MakeDistContext(comm::ProcessGroup* group) {
  if (group == nullptr || group->size() == 1) return DistContext::Single();
  DistContext d;
  d.rank = group->rank();
  d.world_size = group->size();
  d.barrier = [group]() { return group->Barrier()->Wait(); };
  d.all_gather =
      [group](
          const std::string& mine) -> absl::StatusOr<std::vector<std::string>> {
    const int n = group->size();
    Tensor size =
        Tensor::Full({1}, static_cast<double>(mine.size()), DType::kInt64);
    Tensor sizes = Tensor::Empty({n}, DType::kInt64);
    MCC_RETURN_IF_ERROR(group->AllGatherSync(size, &sizes));
    // Peers' counts are checked before anything is sized by them.
    const std::vector<int64_t> bytes(sizes.data<int64_t>(),
                                     sizes.data<int64_t>() + n);
    MCC_RETURN_IF_ERROR(CheckAllGatherSizes(bytes));
    // Bytes travel as int32 words, each rank's string padded to whole words.
    std::vector<int64_t> words(n);
    int64_t total = 0;
    for (int r = 0; r < n; ++r) {
      words[r] = (bytes[r] + 3) / 4;
      total += words[r];
    }
    Tensor in = Tensor::Zeros({words[group->rank()]}, DType::kInt32);
    std::memcpy(in.raw_data(), mine.data(), mine.size());
    Tensor out = Tensor::Empty({total}, DType::kInt32);
    MCC_RETURN_IF_ERROR(group->AllGatherVSync(in, &out, words));
    std::vector<std::string> all(n);
    const char* p = static_cast<const char*>(out.raw_data());
    for (int r = 0; r < n; ++r) {
      all[r].assign(p, bytes[r]);
      p += words[r] * 4;
    }
    return all;
  };
  return d;
}

}  // namespace training
}  // namespace mcc
