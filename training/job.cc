#include "training/job.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/comm/env.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "data/blended_dataset.h"
#include "data/default_corpus.h"
#include "data/mock_dataset.h"
#include "glog/logging.h"
#include "training/model_from_config.h"

namespace mcc {
namespace training {
namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::Status Job::Barrier() const {
  if (!world.has_value()) return absl::OkStatus();
  return world->group->Barrier()->Wait();
}

int WorldSizeFromEnvironment() {
  auto env = comm::DistEnvFromEnvironment();
  return env.ok() ? env->world_size : 1;
}

bool IsFirstRank() {
  auto env = comm::DistEnvFromEnvironment();
  return !env.ok() || env->rank == 0;
}

// oneDNN runs its GEMMs on libgomp, whose threads by default spin for a
// while after each parallel region; on a 2-core machine that spinning takes a
// core from ThreadPool's attention and elementwise kernels between the GEMMs
// (about 8% of a bench-preset step). libgomp reads OMP_WAIT_POLICY when it is
// loaded, before main, so the process runs itself again with it set. The
// user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone.
void UsePassiveOpenMpWait() {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr ||
      std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
  std::vector<std::string> args = absl::StrSplit(cmdline, '\0');
  if (!args.empty() && args.back().empty()) args.pop_back();
  if (args.empty()) return;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv.data());
  // Could not run again: carry on with the default policy.
  LOG(WARNING) << "could not re-run with OMP_WAIT_POLICY=passive";
}

void ConfigureThreads(const TrainConfig& train_config) {
  UsePassiveOpenMpWait();
  if (train_config.num_threads() > 0) {
    ThreadPool::SetGlobalThreads(train_config.num_threads());
    return;
  }
  if (std::getenv("MCC_NUM_THREADS") != nullptr ||
      std::getenv("OMP_NUM_THREADS") != nullptr) {
    return;
  }
  auto env = comm::DistEnvFromEnvironment();
  const int local = env.ok() ? std::max(1, env->local_world_size) : 1;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int threads = std::max(1, cores / local);
  // Before any kernel library reads it, so oneDNN follows too.
  setenv("MCC_NUM_THREADS", std::to_string(threads).c_str(), 1);
  setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
}

absl::StatusOr<absl::Duration> DistributedTimeoutFromConfig(
    const TrainConfig& train_config) {
  const double minutes = train_config.distributed_timeout_minutes();
  // Past a year it is a typo or an overflow, not a timeout.
  if (!(minutes > 0) || minutes > 365 * 24 * 60) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--distributed-timeout-minutes must be positive and at most a year, "
        "got ",
        minutes));
  }
  return absl::Seconds(minutes * 60);
}

absl::Status CheckConfigBeforeLaunch(const TrainConfig& train_config,
                                     int world_size) {
  MCC_RETURN_IF_ERROR(DistributedTimeoutFromConfig(train_config).status());
  const int tp = train_config.tensor_model_parallel_size();
  const int pp = train_config.pipeline_model_parallel_size();
  const int cp = train_config.context_parallel_size();
  const int instances = train_config.num_distributed_optimizer_instances();
  parallel::ParallelSizes sizes;
  sizes.tensor = tp;
  sizes.pipeline = pp;
  sizes.context = cp;
  sizes.distributed_optimizer_instances = instances;
  MCC_RETURN_IF_ERROR(parallel::RankLayout::Create(world_size, sizes).status());
  if (instances > 1 && !train_config.use_distributed_optimizer() &&
      train_config.data_parallel_sharding_strategy() == "no_shard") {
    return absl::InvalidArgumentError(
        "--num-distributed-optimizer-instances above 1 needs sharded "
        "optimizer state (--use-distributed-optimizer or "
        "--data-parallel-sharding-strategy optim, optim_grads or "
        "optim_grads_params)");
  }
  if (train_config.micro_batch_size() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--micro-batch-size must be positive, got ",
                     train_config.micro_batch_size()));
  }
  int64_t vocab = 257;
  if (train_config.mock_data()) {
    if (train_config.vocab_size() > 0) vocab = train_config.vocab_size();
  } else {
    MCC_ASSIGN_OR_RETURN(
        auto tokenizer,
        data::CreateTokenizer(
            train_config.tokenizer_type(),
            data::TokenizerFiles{train_config.vocab_file(),
                                 train_config.merge_file(),
                                 train_config.tokenizer_model()}));
    vocab = tokenizer->vocab_size();
    const std::string path = train_config.data_path();
    if (!path.empty()) {
      MCC_ASSIGN_OR_RETURN(data::Blend blend, data::ParseDataPath(path));
      for (const std::string& prefix : blend.prefixes) {
        for (const char* ext : {".bin", ".idx"}) {
          if (!FileExists(prefix + ext)) {
            return absl::NotFoundError(
                absl::StrCat("--data-path: ", prefix, ext, " does not exist"));
          }
        }
      }
    }
    MCC_RETURN_IF_ERROR(data::ParseSplit(train_config.split()).status());
  }
  MCC_RETURN_IF_ERROR(PipelineConfigFromConfig(train_config).status());
  return GPTConfigFromConfig(train_config, vocab).status();
}

absl::Status JoinWorld(const TrainConfig& train_config, Job* job,
                       DeviceChoice device) {
  job->device = std::move(device);
  auto env = comm::DistEnvFromEnvironment();
  if (env.ok() && env->world_size > 1) {
    LOG(INFO) << "rank " << env->rank << ": device "
              << job->device.device.ToString() << " (" << job->device.reason
              << ")";
    comm::GroupOptions options;
    MCC_ASSIGN_OR_RETURN(options.timeout,
                         DistributedTimeoutFromConfig(train_config));
    // gloo for host tensors and barriers; for a device that is not the
    // host, a device world beside it (NCCL for CUDA).
    MCC_ASSIGN_OR_RETURN(comm::World world,
                         comm::InitWorld(*env, options, job->device.device));
    job->world = std::move(world);
    if (env->rank == 0) {
      LOG(INFO) << "collectives, p2p transfers and the rendezvous time out "
                   "after "
                << absl::FormatDuration(options.timeout)
                << " (--distributed-timeout-minutes)";
    }
    job->rank = env->rank;
    job->world_size = env->world_size;
    job->local_world_size = env->local_world_size;
    parallel::ParallelSizes sizes;
    sizes.tensor = train_config.tensor_model_parallel_size();
    sizes.pipeline = train_config.pipeline_model_parallel_size();
    sizes.context = train_config.context_parallel_size();
    sizes.expert_model = train_config.expert_model_parallel_size();
    sizes.expert_tensor = train_config.expert_tensor_parallel_size();
    if (sizes.expert_tensor == 0 && train_config.num_experts() > 0 &&
        !train_config.sequence_parallel()) {
      // Without SP every TP rank routes the same tokens: the experts stay
      // whole (ETP is TP's only under SP, Megatron's default).
      sizes.expert_tensor = 1;
    }
    sizes.distributed_optimizer_instances =
        train_config.num_distributed_optimizer_instances();
    MCC_ASSIGN_OR_RETURN(
        job->state, parallel::ParallelState::Create(job->world->group, sizes,
                                                    job->world->device_group));
    if (job->is_logging_rank()) LOG(INFO) << job->state->ToString();
  } else {
    LOG(INFO) << "device " << job->device.device.ToString() << " ("
              << job->device.reason << ")";
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Job>> SetupJob(const TrainConfig& train_config,
                                              DeviceChoice device) {
  auto job = std::make_unique<Job>();
  MCC_RETURN_IF_ERROR(JoinWorld(train_config, job.get(), std::move(device)));
  if (train_config.mock_data()) {
    job->vocab_size =
        train_config.vocab_size() > 0 ? train_config.vocab_size() : 257;
  } else {
    MCC_ASSIGN_OR_RETURN(
        job->tokenizer,
        data::CreateTokenizer(
            train_config.tokenizer_type(),
            data::TokenizerFiles{train_config.vocab_file(),
                                 train_config.merge_file(),
                                 train_config.tokenizer_model()}));
    job->vocab_size = job->tokenizer->vocab_size();
  }
  MCC_ASSIGN_OR_RETURN(job->config,
                       GPTConfigFromConfig(train_config, job->vocab_size));
  job->context.tp_group = job->tp();
  job->context.sequence_parallel = train_config.sequence_parallel();
  job->context.cp_group = job->cp();
  if (job->state != nullptr && job->config.num_experts > 0 &&
      (job->state->expert_model()->size() > 1 ||
       job->state->expert_tensor()->size() > 1)) {
    // Experts over the expert groups (training::ExpertLayoutOf checks).
    job->context.expert_layout = true;
    job->context.expert_model_group = job->state->expert_model();
    job->context.expert_tensor_group = job->state->expert_tensor();
    job->context.moe_alltoall_dispatcher =
        train_config.moe_token_dispatcher_type() == "alltoall";
  }
  MCC_ASSIGN_OR_RETURN(job->context.cp_comm_type,
                       CpCommTypeFromConfig(train_config));
  if (job->cp() != nullptr && job->is_logging_rank()) {
    LOG(INFO) << "context parallelism: each sequence in "
              << 2 * job->cp()->size() << " chunks over " << job->cp()->size()
              << " ranks, attention by " << train_config.cp_comm_type()
              << (job->context.cp_comm_type ==
                          parallel::LayerContext::CpCommType::kP2P
                      ? " (ring: K/V around the CP ring)"
                      : " (all-to-all over heads)");
  }
  job->context.dtype = train_config.bf16()   ? DType::kBFloat16
                       : train_config.fp16() ? DType::kFloat16
                                             : DType::kFloat32;
  job->context.seed = job->config.seed;
  MCC_ASSIGN_OR_RETURN(job->context.fp8, Fp8RecipeFromConfig(train_config));
  if (job->context.fp8.has_value() && job->is_logging_rank()) {
    LOG(INFO) << "FP8: the linear layers' GEMMs in "
              << DescribeFp8Recipe(*job->context.fp8)
              << " (emulated on the CPU; the output layer stays in "
              << DTypeName(job->context.dtype) << ")";
  }
  // Parameters, gradients, optimizer state and activations live there;
  // the model stages each micro-batch there.
  job->context.device = job->device.device;
  MCC_ASSIGN_OR_RETURN(job->pipeline, PipelineConfigFromConfig(train_config));
  MCC_ASSIGN_OR_RETURN(job->model,
                       gpt::StageModel::Create(job->config, job->context,
                                               job->pipeline, job->pp_rank()));
  return job;
}

std::string DefaultRunDir() {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return absl::StrCat(workspace != nullptr ? workspace : ".", "/runs/default");
}

absl::StatusOr<std::array<std::shared_ptr<const data::SampleDataset>, 3>>
BuildDatasets(const TrainConfig& train_config, const Job& job,
              const std::array<int64_t, 3>& samples) {
  std::array<std::shared_ptr<const data::SampleDataset>, 3> out;
  const int64_t seq = job.config.seq_length;
  if (train_config.mock_data()) {
    for (int i = 0; i < 3; ++i) {
      out[i] = std::make_shared<data::MockDataset>(
          samples[i], seq, job.vocab_size, job.config.seed + 1000 * i);
    }
    return out;
  }
  std::string path = train_config.data_path();
  if (path.empty()) {
    MCC_ASSIGN_OR_RETURN(path,
                         data::EnsureDefaultCorpus(DefaultRunDir() + "/data"));
  }
  MCC_ASSIGN_OR_RETURN(data::Blend blend, data::ParseDataPath(path));
  data::GPTDatasetConfig config;
  config.sequence_length = static_cast<int32_t>(seq);
  config.random_seed = static_cast<uint32_t>(job.config.seed);
  config.loss_mask = train_config.sft();
  if (!train_config.data_cache_path().empty()) {
    config.path_to_cache = train_config.data_cache_path();
  }
  data::RankSync sync;
  sync.rank = [&job] { return job.rank; };
  sync.barrier = [&job] { return job.Barrier(); };
  std::array<std::optional<int64_t>, 3> sizes;
  for (int i = 0; i < 3; ++i) sizes[i] = samples[i];
  return data::BuildGPTDatasets(blend, train_config.split(), sizes, config,
                                sync);
}

}  // namespace training
}  // namespace mcc
