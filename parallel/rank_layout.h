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
//
// Mixture-of-experts layers lay the same ranks out a second way, as
// Megatron-Core's expert rank generator does (no context parallelism there):
//   rank = etp + ETP * (ep + EP * (edp + EDP * pp)),
// expert tensor parallel (ETP) innermost, then expert model parallel (EP,
// the experts split across it), then expert data parallel (EDP = world /
// (ETP x EP x PP): the ranks that hold the same experts), then the pipeline.
// The pipeline coordinate is the dense layout's, so both layouts share the
// pipeline groups; attention keeps TP, CP and DP.
struct ParallelSizes {
  int tensor = 1;
  int pipeline = 1;
  int context = 1;
  int expert_model = 1;   // --expert-model-parallel-size.
  int expert_tensor = 0;  // --expert-tensor-parallel-size; 0: tensor's.
  // --num-distributed-optimizer-instances (HSDP): the DP x CP ranks of each
  // group split into this many instances of contiguous ranks; optimizer
  // state is sharded within an instance and replicated across them. Must
  // divide DP x CP, and the expert-data-parallel size (the experts' state
  // splits into as many instances of the expert-data group).
  int distributed_optimizer_instances = 1;
};

struct RankCoordinates {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;
};

// A rank's place in the experts' layout.
struct ExpertCoordinates {
  int etp = 0;
  int ep = 0;
  int edp = 0;
  int pp = 0;
};

class RankLayout {
 public:
  // Fails, showing the numbers and naming the flags, when the sizes do not
  // divide the world size (dense or expert layout) or any size is not
  // positive.
  static absl::StatusOr<RankLayout> Create(int world_size, ParallelSizes sizes);

  int world_size() const { return world_size_; }
  int tensor_size() const { return tp_; }
  int pipeline_size() const { return pp_; }
  int context_size() const { return cp_; }
  int data_size() const { return dp_; }
  int expert_model_size() const { return ep_; }
  int expert_tensor_size() const { return etp_; }
  int expert_data_size() const { return edp_; }
  int distributed_optimizer_instances() const { return instances_; }

  RankCoordinates Coordinates(int rank) const;
  int RankOf(const RankCoordinates& c) const;
  ExpertCoordinates ExpertCoordinatesOf(int rank) const;

  // All groups of one kind, covering every rank exactly once.
  std::vector<std::vector<int>> TensorGroups() const;
  std::vector<std::vector<int>> PipelineGroups() const;
  std::vector<std::vector<int>> ContextGroups() const;
  std::vector<std::vector<int>> DataGroups() const;
  std::vector<std::vector<int>> DataContextGroups() const;    // DP x CP
  std::vector<std::vector<int>> TensorContextGroups() const;  // TP x CP
  std::vector<std::vector<int>> ModelGroups() const;          // TP x PP
  // HSDP: each DP x CP group cut into distributed_optimizer_instances
  // contiguous runs (an instance: neighbouring ranks, one node when it
  // fits), and across them the ranks at the same place in every run. With
  // one instance: the DP x CP groups, and single ranks.
  std::vector<std::vector<int>> InstanceGroups() const;
  std::vector<std::vector<int>> CrossInstanceGroups() const;
  // First and last stage of each pipeline group (one rank when PP is 1):
  // the ranks that hold the tied word embeddings.
  std::vector<std::vector<int>> EmbeddingGroups() const;

  // The experts' groups (Megatron's names in brackets).
  std::vector<std::vector<int>> ExpertModelGroups() const;   // EP [ep]
  std::vector<std::vector<int>> ExpertTensorGroups() const;  // ETP [tp]
  // ETP x EP [tp-ep]: the ranks among which one copy of every expert lies.
  std::vector<std::vector<int>> ExpertTensorModelGroups() const;
  // EDP [dp]: the ranks holding the same expert shards, over which expert
  // gradients are reduced.
  std::vector<std::vector<int>> ExpertDataGroups() const;
  // HSDP: each EDP group cut into distributed_optimizer_instances
  // contiguous runs, and across them the ranks at the same place in every
  // run (as InstanceGroups over DP x CP; Megatron's intra- and inter-partial
  // expert data-parallel groups).
  std::vector<std::vector<int>> ExpertInstanceGroups() const;
  std::vector<std::vector<int>> ExpertCrossInstanceGroups() const;

  // The group of a given kind that contains rank.
  static std::vector<int> GroupOf(const std::vector<std::vector<int>>& groups,
                                  int rank);

  // "world 8 = TP 2 x CP 1 x DP 2 x PP 2", and when EP > 1 or ETP != TP
  // "; experts ETP 1 x EP 2 x EDP 2 x PP 2".
  std::string ToString() const;

 private:
  // Groups that vary the dimensions where vary[d] is true (order tp, cp, dp,
  // pp), one group per setting of the others.
  std::vector<std::vector<int>> Groups(bool tp, bool cp, bool dp,
                                       bool pp) const;
  // The same over the experts' layout (order etp, ep, edp, pp).
  std::vector<std::vector<int>> ExpertGroups(bool etp, bool ep, bool edp,
                                             bool pp) const;

  int world_size_ = 1;
  int tp_ = 1;
  int cp_ = 1;
  int dp_ = 1;
  int pp_ = 1;
  int ep_ = 1;
  int etp_ = 1;
  int edp_ = 1;
  int instances_ = 1;
};

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_RANK_LAYOUT_H_
