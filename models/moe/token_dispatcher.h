#ifndef MODELS_MOE_TOKEN_DISPATCHER_H_
#define MODELS_MOE_TOKEN_DISPATCHER_H_

// Expert parallelism's token movement (issue 41): the experts are split
// evenly over the expert-model-parallel (EP) group, rank p holding experts
// [p E_l, (p + 1) E_l), E_l = E / EP. Each rank routes and permutes its own
// tokens (MoeMlp), giving rows grouped by global expert; the dispatcher moves
// every row to the rank holding its expert and the experts' outputs back:
//
//   Plan      all-gather of every rank's rows per expert (the splits)
//   Dispatch  rows [n, h] grouped by expert -> this rank's rows [m, h]
//             grouped by local expert, and within one expert by source rank
//             (then by the source's order: token, then choice)
//   Combine   the inverse movement: local rows [m, h] -> rows [n, h]
//
// alltoall: the rows for rank d are one contiguous block, sent point to point
// (an all-to-all-v over the EP group as BatchP2P) and regrouped by local
// expert on arrival. allgather: every rank's rows are all-gathered
// (AllGatherV) and each rank copies out its experts' blocks; Combine places
// the local outputs at their sources' rows in a zero buffer and
// reduce-scatters it (each row has one nonzero contributor, so the sum is
// exact). Megatron's allgather dispatcher gathers tokens before permuting,
// k times fewer rows than gathering the permuted rows as here; what reaches
// the experts is the same.
//
// Expert tensor parallelism (ETP) uses the allgather form over the ETP group
// with the experts replicated (CreateReplicated): every rank holds a slice
// of every local expert, Dispatch gathers all the group's rows (grouped by
// expert, then rank) and Combine reduce-scatters the partial outputs, here
// a true sum over the ranks' slices.
//
// Dispatch and Combine only copy rows, so both are exact, are each other's
// transpose (the backward of one is the other over the same plan) and give
// the same rows in the same order on every run and with either type.
// Tensors are on the group's device; counts travel as int64 on it. Plan,
// Dispatch and Combine show in the op profile (core/op_profile.h) as
// MoeDispatchPlan, MoeDispatch and MoeCombine.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/comm/process_group.h"
#include "core/tensor.h"

namespace mcc {
namespace moe {

enum class TokenDispatcherType { kAllToAll, kAllGather };

// "alltoall" or "allgather" (Megatron's --moe-token-dispatcher-type names).
absl::StatusOr<TokenDispatcherType> ParseTokenDispatcherType(
    absl::string_view name);
const char* TokenDispatcherTypeName(TokenDispatcherType type);

// The splits of one layer's forward, kept for its backward.
struct DispatchPlan {
  // counts[s * E + e]: rows EP rank s has for expert e.
  std::vector<int64_t> counts;
  // Rows per local expert, over every source: the grouped GEMMs' sizes.
  std::vector<int64_t> local_counts;
  int64_t rows = 0;        // n: this rank's rows (sum of its counts).
  int64_t local_rows = 0;  // m: rows for this rank's experts.
};

class TokenDispatcher {
 public:
  // group: the EP group (null or size 1 is refused: no dispatcher is
  // needed); num_experts must divide evenly over it.
  static absl::StatusOr<std::unique_ptr<TokenDispatcher>> Create(
      TokenDispatcherType type, comm::ProcessGroup* group, int64_t num_experts);

  // Every rank of `group` holds (a slice of) all num_experts experts: the
  // allgather form, whose Combine sums the ranks' partial outputs.
  static absl::StatusOr<std::unique_ptr<TokenDispatcher>> CreateReplicated(
      comm::ProcessGroup* group, int64_t num_experts);

  int64_t local_experts() const { return local_experts_; }
  int64_t first_expert() const {
    return replicated_ ? 0 : group_->rank() * local_experts_;
  }
  TokenDispatcherType type() const { return type_; }

  // Collective over the group: tokens_per_expert [E] are this rank's.
  absl::StatusOr<DispatchPlan> Plan(
      const std::vector<int64_t>& tokens_per_expert) const;
  // Collective: rows [plan.rows, h] -> [plan.local_rows, h].
  absl::StatusOr<Tensor> Dispatch(const Tensor& rows,
                                  const DispatchPlan& plan) const;
  // Collective: local rows [plan.local_rows, h] -> [plan.rows, h].
  absl::StatusOr<Tensor> Combine(const Tensor& local_rows,
                                 const DispatchPlan& plan) const;

 private:
  TokenDispatcher(TokenDispatcherType type, comm::ProcessGroup* group,
                  int64_t num_experts, bool replicated)
      : type_(type),
        group_(group),
        num_experts_(num_experts),
        local_experts_(replicated ? num_experts : num_experts / group->size()),
        replicated_(replicated) {}

  // Row offset of expert e's block in source s's rows.
  int64_t SourceOffset(const DispatchPlan& plan, int s, int64_t e) const;

  TokenDispatcherType type_;
  comm::ProcessGroup* group_;
  int64_t num_experts_;
  int64_t local_experts_;
  bool replicated_;
};

}  // namespace moe
}  // namespace mcc

#endif  // MODELS_MOE_TOKEN_DISPATCHER_H_
