#include "checkpoint/dist_context.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace mcc {

DistContext DistContext::Single() {
  DistContext ctx;
  ctx.rank = 0;
  ctx.world_size = 1;
  ctx.barrier = [] { return absl::OkStatus(); };
  ctx.all_gather =
      [](const std::string& mine) -> absl::StatusOr<std::vector<std::string>> {
    return std::vector<std::string>{mine};
  };
  return ctx;
}

absl::Status CheckAllGatherSizes(const std::vector<int64_t>& sizes,
                                 int64_t max_bytes_per_rank) {
  int64_t total_words = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    if (sizes[r] < 0 || sizes[r] > max_bytes_per_rank) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint all-gather: rank ", r, " announced ", sizes[r],
          " bytes (allowed: 0 to ", max_bytes_per_rank, ")"));
    }
    // Bounded by max_bytes_per_rank / 4 + 1 per rank; no overflow unless
    // the world is absurd, which the check below catches.
    const int64_t words = (sizes[r] + 3) / 4;
    if (total_words > std::numeric_limits<int64_t>::max() / 4 - words) {
      return absl::DataLossError(
          absl::StrCat("checkpoint all-gather: the sizes up to rank ", r,
                       " add up past what int64 counts"));
    }
    total_words += words;
  }
  return absl::OkStatus();
}

}  // namespace mcc
