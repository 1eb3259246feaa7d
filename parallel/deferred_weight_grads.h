#ifndef PARALLEL_DEFERRED_WEIGHT_GRADS_H_
#define PARALLEL_DEFERRED_WEIGHT_GRADS_H_

#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace mcc {
namespace parallel {

// Weight-gradient work that a split backward's input-gradient step (B)
// leaves for its weight-gradient step (W; see
// PipelineStage::BackwardInputStep): each item accumulates some
// parameters' gradients (or reports them complete) and holds the tensors it
// reads until it has run. Run runs the items in the order they were added,
// so every parameter's contributions keep the order of the unsplit
// backward.
class DeferredWeightGrads {
 public:
  using Work = std::function<absl::Status()>;

  void Add(Work work) { work_.push_back(std::move(work)); }
  bool empty() const { return work_.empty(); }

  // Runs every item in order, stopping at the first error, and frees them
  // (and what they held).
  absl::Status Run() {
    std::vector<Work> work = std::move(work_);
    work_.clear();
    for (Work& w : work) {
      absl::Status s = w();
      w = nullptr;  // Frees its tensors as soon as it has run.
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  std::vector<Work> work_;
};

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_DEFERRED_WEIGHT_GRADS_H_
