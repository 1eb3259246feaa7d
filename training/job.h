#ifndef TRAINING_JOB_H_
#define TRAINING_JOB_H_

#include <array>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/comm/init.h"
#include "data/sample_dataset.h"
#include "data/tokenizer.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/stage_model.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline/layer_split.h"
#include "training/device_choice.h"
#include "training/train_config.pb.h"

namespace mcc {
namespace training {

// What a training run and evaluation share: where this process sits, its
// groups, the tokenizer and the model, all from the TrainConfig.
struct Job {
  int rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  // Where the model, optimizer state, batches and loss live (--device), and
  // why that one.
  DeviceChoice device{Device::CPU(), "the default"};
  std::optional<comm::World> world;  // Unset for a single process.
  std::unique_ptr<parallel::ParallelState> state;
  std::unique_ptr<data::Tokenizer> tokenizer;
  int64_t vocab_size = 0;  // The tokenizer's (or --vocab-size for mock data).
  gpt::GPTConfig config;
  parallel::LayerContext context;
  pipeline::PipelineConfig pipeline;  // How the layers split over stages.
  // This stage's model chunks (the whole model without pipelining).
  std::unique_ptr<gpt::StageModel> model;

  comm::ProcessGroup* tp() const { return state ? state->tensor() : nullptr; }
  comm::ProcessGroup* dp() const { return state ? state->data() : nullptr; }
  // Null without context parallelism.
  comm::ProcessGroup* cp() const {
    return state && state->layout().context_size() > 1 ? state->context()
                                                       : nullptr;
  }
  // The group data parallelism reduces (and shards) gradients over: DP, or
  // DP x CP under context parallelism, as Megatron's.
  comm::ProcessGroup* grad_dp() const {
    return cp() != nullptr ? state->data_context() : dp();
  }
  // Null without pipelining.
  comm::ProcessGroup* pp() const {
    return state && state->layout().pipeline_size() > 1 ? state->pipeline()
                                                        : nullptr;
  }
  int pp_rank() const { return state ? state->pipeline_rank() : 0; }
  int dp_size() const { return state ? state->layout().data_size() : 1; }
  int dp_rank() const { return state ? state->data_rank() : 0; }
  bool is_logging_rank() const { return rank == 0; }
  // The twin of one of this job's groups that moves tensors on `d`: the
  // host (gloo) twin for CPU tensors, the device twin for the device's
  // (ParallelState::GroupFor). `group` itself for a single process.
  comm::ProcessGroup* GroupFor(comm::ProcessGroup* group, Device d) const {
    return state ? state->GroupFor(group, d) : group;
  }
  // A barrier over the world (nothing for one process).
  absl::Status Barrier() const;
};

// distributed_timeout_minutes as a duration; InvalidArgument naming the
// flag when it is not positive.
absl::StatusOr<absl::Duration> DistributedTimeoutFromConfig(
    const TrainConfig& train_config);

// Everything that can be checked before any process group forms: the
// settings against each other and the world size from the launcher's
// environment, the tokenizer files and the data paths. Errors name the flag
// at fault.
absl::Status CheckConfigBeforeLaunch(const TrainConfig& train_config,
                                     int world_size);

// The world size the launcher's environment describes (1 without one).
int WorldSizeFromEnvironment();

// Whether this process is rank 0 (or alone): it prints warnings about flags.
bool IsFirstRank();

// Splits the CPU cores among the local ranks unless num_threads is given.
// Runs this process again with OMP_WAIT_POLICY=passive unless it or
// GOMP_SPINCOUNT is set (libgomp reads it before main): oneDNN's spinning
// OpenMP threads otherwise take the cores from the other kernels. train does
// it in ConfigureThreads; the planner's CPU probe must measure under the
// same policy as the run it predicts.
void UsePassiveOpenMpWait();
void ConfigureThreads(const TrainConfig& train_config);

// Sets job->device and, under a launcher (world size above 1), joins the
// world and creates the groups of the flags' layout into *job, each with a
// device twin when the device is not the host (NCCL for CUDA). A single
// process stays alone. Logs the device and why it was chosen.
absl::Status JoinWorld(const TrainConfig& train_config, Job* job,
                       DeviceChoice device);

// Joins the world (JoinWorld), creates the groups, the tokenizer and the
// model on `device`.
absl::StatusOr<std::unique_ptr<Job>> SetupJob(const TrainConfig& train_config,
                                              DeviceChoice device);

// Where runs without --save or --data-path keep their files: the workspace
// (under `bazel run`) or the current directory, plus "runs/default".
std::string DefaultRunDir();

// Train, valid and test datasets from data_path (or the embedded corpus,
// or mock_data), sized for `samples` per split as Megatron sizes them.
absl::StatusOr<std::array<std::shared_ptr<const data::SampleDataset>, 3>>
BuildDatasets(const TrainConfig& train_config, const Job& job,
              const std::array<int64_t, 3>& samples);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_JOB_H_
