#include "optim/offload_split.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace optim {

absl::StatusOr<std::vector<bool>> SplitForOffload(
    absl::Span<const int64_t> sizes, double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--optimizer-offload-fraction ", fraction, " must lie in [0, 1]"));
  }
  double total = 0;
  for (int64_t n : sizes) {
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer offload: a piece of ", n, " elements"));
    }
    total += static_cast<double>(n);
  }
  std::vector<bool> offloaded(sizes.size(), false);
  const double target = fraction * total;
  double on_host = 0;
  for (size_t i = 0; i < sizes.size() && on_host < target; ++i) {
    offloaded[i] = true;
    on_host += static_cast<double>(sizes[i]);
  }
  return offloaded;
}

}  // namespace optim
}  // namespace mcc
