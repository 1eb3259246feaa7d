#ifndef TRAINING_STEP_FLOPS_H_
#define TRAINING_STEP_FLOPS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "data/loader.h"
#include "models/gpt/gpt_config.h"

// The model FLOPs of each training step, for TFLOP/s and MFU: Megatron's
// count (models/gpt/model_flops.h) with the attention term limited to the
// (query, key) pairs packed documents (--reset-attention-mask) and a
// sliding window (--window-size) leave, read from the step's micro-batches.

namespace mcc {
namespace training {

class StepFlopsCounter {
 public:
  // documents: the micro-batches carry document starts
  // (--reset-attention-mask). dp_host: the data-parallel group's host
  // twin, over which a step's document pairs are summed (null: one rank).
  StepFlopsCounter(const gpt::GPTConfig& config, bool documents,
                   comm::ProcessGroup* dp_host);

  // Counts a micro-batch of this rank's share of the step.
  void Add(const data::MicroBatch& micro_batch);
  // The step's FLOPs over its `global_batch` samples, then starts the next
  // step. With documents, collective over the data-parallel group (every
  // rank calls it each step).
  absl::StatusOr<double> TakeStepFlops(int64_t global_batch);

  // What the attention term counts, for the run's first log lines.
  std::string Describe() const;

 private:
  gpt::GPTConfig config_;
  bool documents_ = false;
  comm::ProcessGroup* dp_host_ = nullptr;
  int64_t pairs_ = 0;      // This rank's, this step.
  int64_t sequences_ = 0;  // This rank's, this step.
};

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_STEP_FLOPS_H_
