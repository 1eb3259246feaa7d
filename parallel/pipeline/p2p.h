#ifndef PARALLEL_PIPELINE_P2P_H_
#define PARALLEL_PIPELINE_P2P_H_

#include <memory>
#include <vector>

#include "core/comm/process_group.h"
#include "core/tensor.h"
#include "parallel/pipeline/schedules.h"

namespace mcc {
namespace pipeline {

// Where a stage's activations and gradients come from and go to. Stages
// are the pipeline group's ranks; activations flow to the next stage,
// gradients to the previous one, and the last stage's next is stage 0 (and
// stage 0's previous the last) so that interleaved chunks form a ring:
// virtual stage chunk x stages + stage feeds the one after it. V-shaped
// (ZB-V, two chunks): chunk 0 flows down the stages and chunk 1 back up, so
// the last stage's chunk 0 hands its output to its own chunk 1 (and chunk
// 1's input gradient to chunk 0) without a transfer, and stage 0's chunk 1
// computes the loss.
struct StageLayout {
  int stages = 1;
  int stage = 0;
  int chunks = 1;  // Model chunks (virtual stages) per stage.
  bool v_shape = false;

  int Next() const { return (stage + 1) % stages; }
  int Prev() const { return (stage + stages - 1) % stages; }
  // Whether action `a` receives its input (activations for a forward, the
  // output's gradient for a backward) from a neighbour, and from which.
  bool Receives(const Action& a) const;
  int Source(const Action& a) const;
  // Whether action `a` sends its result (activations, input gradient) to a
  // neighbour, and to which.
  bool Sends(const Action& a) const;
  int Destination(const Action& a) const;
  // The action of stage Destination(a) that consumes what `a` sends.
  Action Consumer(const Action& a) const;
  // Whether what `a` produces (forward output, input gradient) is consumed
  // by another chunk of this stage (the V's turn on the last stage), and
  // by which action.
  bool HandsOffLocally(const Action& a) const;
  Action LocalConsumer(const Action& a) const;
  // Whether `a`'s input comes from another chunk of this stage.
  bool TakesLocalInput(const Action& a) const;
  // The (stage, chunk) that takes the batch input and the one computing the
  // loss.
  bool TakesBatchInput(int chunk) const;
  bool ComputesLoss(int chunk) const;

 private:
  int virtual_stage(int chunk) const {
    return VirtualStage(stages, stage, chunk, v_shape);
  }
  // The stage after (before) this chunk's virtual stage, or -1 at the ends.
  int NeighbourAt(int chunk, int step) const;
};

// A stage's schedule cut into units that compute without communicating,
// and the transfers posted as one batch before each unit: the results of
// the previous unit's actions that go to a neighbour, and the inputs of the
// next unit's actions that come from one (sends first, each in action
// order). Each action is a unit of its own, except that with virtual stages
// a forward followed by a backward in the steady state make one unit
// (Megatron's interleaved steady state, which sends both results and
// receives both inputs of the next pair together; one action per batch
// would deadlock there over NCCL). Posting exactly these batches, in order,
// is free of deadlock and needs no tags: between two stages the sends of one
// match the other's receives in posting order, even when the previous and the
// next stage are the same peer (two stages), and also where each batch waits
// for the one posted before it and every send waits for its receive (NCCL's
// stream order). p2p_test checks this for every schedule by simulation.
struct TransferBatch {
  // The batch precedes actions [first_action, end_action) (the unit; both
  // are actions.size() for the batch after the last unit).
  int first_action = 0;
  int end_action = 0;
  std::vector<int> send_actions;  // Whose results are sent.
  std::vector<int> recv_actions;  // Whose inputs are received.
  bool empty() const { return send_actions.empty() && recv_actions.empty(); }
};
// One batch per unit, then one after the last (units + 1 in all; some may
// be empty).
//
// V-shaped (ZB-V), a channel between two stages carries two streams (chunk
// 0's activations and chunk 1's gradients one way, the reverse the other)
// whose production order on the sender differs from their consumption
// order on the receiver. Then `stage_actions` (every stage's actions) must
// be given, and every action is a unit. Each stage simulates all stages'
// orders with unit-time actions (an action runs once its input was sent, a
// result is sent right after its action), which lists every transfer in
// one global order, and posts a receive in the batch before its next
// action at the time of the send (received ahead, held until its action).
// Each stage's transfers are then the global order's, so between two
// stages they match in posting order, and the plan cannot deadlock even
// where every send waits for its receive (NCCL): the earliest unfinished
// transfer is in both its stages' current batches.
std::vector<TransferBatch> PlanTransfers(
    const StageLayout& layout, const std::vector<Action>& actions,
    const std::vector<std::vector<Action>>* stage_actions = nullptr);

// Posts a batch's transfers over the pipeline group together
// (ProcessGroup::BatchP2P: one ncclGroupStart/End over NCCL), without tags.
class PipelineP2P {
 public:
  explicit PipelineP2P(comm::ProcessGroup* pipeline) : group_(pipeline) {}

  int stage() const { return group_->rank(); }
  int stages() const { return group_->size(); }

  struct Transfer {
    Tensor tensor;  // Sent, or received into.
    int peer = 0;
  };
  // Null when both lists are empty.
  std::shared_ptr<comm::Work> Exchange(const std::vector<Transfer>& sends,
                                       const std::vector<Transfer>& recvs);

 private:
  comm::ProcessGroup* group_;
};

}  // namespace pipeline
}  // namespace mcc

#endif  // PARALLEL_PIPELINE_P2P_H_
