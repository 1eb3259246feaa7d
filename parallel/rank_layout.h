#ifndef PARALLEL_RANK_LAYOUT_H_
#define PARALLEL_RANK_LAYOUT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mcc {
namespace parallel {

// Which ranks form which process groups, computed without any communication.
//
// Megatron's order: tensor-parallel ranks innermost (neighbours on a node),
// then context, then data, then pipeline outermost:
//   rank = tp + TP * (cp + CP * (dp + DP * pp)).
// Every group lists its ranks with the innermost varying dimension fastest,
// so a rank's index in a group is its coordinate along that group's axes.
struct ParallelSizes {
  int tensor = 1;
  int pipeline = 1;
  int context = 1;
};

struct RankCoordinates {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;
};

class RankLayout {
 public:
  // Fails, showing the numbers, when the sizes do not divide the world size
  // or any size is not positive.
  static absl::StatusOr<RankLayout> Create(int world_size, ParallelSizes sizes);

  int world_size() const { return world_size_; }
  int tensor_size() const { return tp_; }
  int pipeline_size() const { return pp_; }
  int context_size() const { return cp_; }
  int data_size() const { return dp_; }

  RankCoordinates Coordinates(int rank) const;
  int RankOf(const RankCoordinates& c) const;

  // All groups of one kind, covering every rank exactly once.
  std::vector<std::vector<int>> TensorGroups() const;
  std::vector<std::vector<int>> PipelineGroups() const;
  std::vector<std::vector<int>> ContextGroups() const;
  std::vector<std::vector<int>> DataGroups() const;
  std::vector<std::vector<int>> DataContextGroups() const;    // DP x CP
  std::vector<std::vector<int>> TensorContextGroups() const;  // TP x CP
  std::vector<std::vector<int>> ModelGroups() const;          // TP x PP
  // First and last stage of each pipeline group (one rank when PP is 1):
  // the ranks that hold the tied word embeddings.
  std::vector<std::vector<int>> EmbeddingGroups() const;

  // The group of a given kind that contains rank.
  static std::vector<int> GroupOf(const std::vector<std::vector<int>>& groups,
                                  int rank);

  std::string ToString() const;  // "world 8 = TP 2 x CP 1 x DP 2 x PP 2"

 private:
  // Groups that vary the dimensions where vary[d] is true (order tp, cp, dp,
  // pp), one group per setting of the others.
  std::vector<std::vector<int>> Groups(bool tp, bool cp, bool dp,
                                       bool pp) const;

  int world_size_ = 1;
  int tp_ = 1;
  int cp_ = 1;
  int dp_ = 1;
  int pp_ = 1;
};

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_RANK_LAYOUT_H_
