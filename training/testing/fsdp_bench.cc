// Throughput of the data-parallel sharding strategies at DP 2 (by default)
// with one global batch, in one run: the binary starts its own ranks, and
// each rank trains the same GPT under every strategy in turn (rounds
// interleaved, so machine drift hits all alike). Also the persistent bytes
// per parameter of each strategy (bf16 weights, Adam; allocator counts)
// against Megatron's published 18 and 6 + 12/DP.
//
//   tools/bazel run -c opt //training/testing:fsdp_bench
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/allocator.h"
#include "core/comm/init.h"
#include "core/comm/port_reservation.h"
#include "core/comm/process_group.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "models/gpt/gpt_model.h"
#include "optim/lr_schedule.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "training/trainer.h"

ABSL_FLAG(int, world, 2, "Data-parallel ranks to start.");
ABSL_FLAG(int, num_layers, 4, "Transformer layers.");
ABSL_FLAG(int, hidden_size, 256, "Hidden size.");
ABSL_FLAG(int, num_attention_heads, 8, "Attention heads.");
ABSL_FLAG(int, vocab_size, 8192, "Vocabulary.");
ABSL_FLAG(int, seq_length, 128, "Sequence length.");
ABSL_FLAG(int, micro_batch_size, 4, "Sequences per micro-batch.");
ABSL_FLAG(int, global_batch_size, 16, "Sequences per step over all ranks.");
ABSL_FLAG(int, steps, 6, "Timed steps per strategy and round.");
ABSL_FLAG(int, warmup, 2, "Untimed steps per strategy and round.");
ABSL_FLAG(int, rounds, 2, "Rounds over the strategies.");
ABSL_FLAG(bool, bf16, false, "Train in bf16 (fp32 otherwise).");

namespace mcc {
namespace fsdp {
namespace {

const std::vector<ShardingStrategy>& Strategies() {
  static const auto* s = new std::vector<ShardingStrategy>{
      ShardingStrategy::kNoShard, ShardingStrategy::kOptim,
      ShardingStrategy::kOptimGrads, ShardingStrategy::kOptimGradsParams};
  return *s;
}

gpt::GPTConfig Config() {
  gpt::GPTConfig c;
  c.num_layers = absl::GetFlag(FLAGS_num_layers);
  c.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.num_attention_heads = absl::GetFlag(FLAGS_num_attention_heads);
  c.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  c.seq_length = absl::GetFlag(FLAGS_seq_length);
  c.seed = 11;
  return c;
}

gpt::MicroBatch Batch(const gpt::GPTConfig& c, int index) {
  std::mt19937 rng(100 + index);
  const int64_t b = absl::GetFlag(FLAGS_micro_batch_size);
  std::vector<int64_t> tokens(b * c.seq_length), labels(tokens.size());
  for (auto& t : tokens) t = rng() % c.vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    labels[i] = (tokens[i] * 7 + 3) % c.vocab_size;
  }
  gpt::MicroBatch m;
  m.tokens = *Tensor::FromInts(tokens, {b, c.seq_length});
  m.labels = *Tensor::FromInts(labels, {b, c.seq_length});
  return m;
}

struct Model {
  std::unique_ptr<gpt::GPTModel> model;
  std::unique_ptr<data_parallel::DataParallel> dp;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<training::Trainer> trainer;  // Destroyed first.
};

absl::StatusOr<Model> Build(ShardingStrategy s, DType dtype,
                            comm::ProcessGroup* group) {
  Model m;
  parallel::LayerContext ctx;
  ctx.dtype = dtype;
  ctx.seed = 11;
  MCC_ASSIGN_OR_RETURN(m.model, gpt::GPTModel::Create(Config(), ctx));
  FsdpConfig cfg;
  cfg.strategy = s;
  cfg.ddp.overlap_grad_reduce = true;
  cfg.ddp.overlap_param_gather = true;
  MCC_ASSIGN_OR_RETURN(
      m.dp, training::WrapDataParallel({m.model.get()}, group, nullptr, cfg));
  MCC_ASSIGN_OR_RETURN(m.opt, m.dp->CreateOptimizer({}, {}));
  training::TrainerParts parts;
  parts.models = {m.model.get()};
  parts.stages = {m.model.get()};
  parts.data_parallel = m.dp.get();
  parts.optimizer = m.opt.get();
  parts.dp_group = group;
  optim::LrScheduleConfig lr;  // A constant 1e-4.
  lr.lr = 1e-4;
  lr.decay_style = optim::LrDecayStyle::kConstant;
  MCC_ASSIGN_OR_RETURN(optim::LrSchedule schedule,
                       optim::LrSchedule::Create(lr));
  MCC_ASSIGN_OR_RETURN(m.trainer, training::Trainer::Create(parts, schedule));
  return m;
}

// Seconds of `steps` steps after `warmup`; the last step's loss (over the
// global batch).
absl::StatusOr<double> Time(Model& m, comm::ProcessGroup* group, double* loss) {
  const int micro = absl::GetFlag(FLAGS_global_batch_size) /
                    absl::GetFlag(FLAGS_micro_batch_size) / group->size();
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = absl::GetFlag(FLAGS_steps);
  const gpt::GPTConfig c = Config();
  absl::Time start;
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup) {
      MCC_RETURN_IF_ERROR(group->BarrierSync());
      start = absl::Now();
    }
    std::vector<gpt::MicroBatch> batches;
    for (int i = 0; i < micro; ++i) {
      batches.push_back(Batch(c, group->rank() * micro + i));
    }
    m.model->SetMicroBatches(
        std::make_shared<const std::vector<gpt::MicroBatch>>(
            std::move(batches)));
    MCC_ASSIGN_OR_RETURN(training::StepMetrics metrics,
                         m.trainer->Step(micro, step + 1));
    *loss = metrics.loss;
  }
  MCC_RETURN_IF_ERROR(m.trainer->WaitForParameters());
  MCC_RETURN_IF_ERROR(group->BarrierSync());
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// Allocator bytes that stay between steps, per parameter (bf16, Adam).
absl::StatusOr<double> BytesPerParameter(ShardingStrategy s,
                                         comm::ProcessGroup* group) {
  Allocator* alloc = GetAllocator(Device::CPU());
  MCC_RETURN_IF_ERROR(group->BarrierSync());
  const int64_t base = alloc->Stats().current_bytes;
  MCC_ASSIGN_OR_RETURN(Model m, Build(s, DType::kBFloat16, group));
  int64_t numel = 0;
  for (const auto& p : m.dp->parameters())
    numel += NumElements(p->global_shape);
  MCC_RETURN_IF_ERROR(group->BarrierSync());
  return static_cast<double>(alloc->Stats().current_bytes - base) / numel;
}

double Megatron(ShardingStrategy s, int dp) {
  switch (s) {
    case ShardingStrategy::kNoShard:
      return 18;
    case ShardingStrategy::kOptim:
      return 6 + 12.0 / dp;
    case ShardingStrategy::kOptimGrads:
      return 2 + 16.0 / dp;  // Continuing Megatron's accounting.
    case ShardingStrategy::kOptimGradsParams:
      return 16.0 / dp;
  }
  return 0;
}

int Worker() {
  comm::GroupOptions options;
  options.timeout = absl::Minutes(5);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 1;
  }
  comm::ProcessGroup* group = world->group.get();
  const int n = group->size();
  const DType dtype =
      absl::GetFlag(FLAGS_bf16) ? DType::kBFloat16 : DType::kFloat32;
  std::map<ShardingStrategy, double> best, loss;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (ShardingStrategy s : Strategies()) {
      auto m = Build(s, dtype, group);
      if (!m.ok()) {
        std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
        return 1;
      }
      double l = 0;
      auto seconds = Time(*m, group, &l);
      if (!seconds.ok()) {
        std::fprintf(stderr, "%s\n", seconds.status().ToString().c_str());
        return 1;
      }
      const double tokens = static_cast<double>(absl::GetFlag(FLAGS_steps)) *
                            absl::GetFlag(FLAGS_global_batch_size) *
                            absl::GetFlag(FLAGS_seq_length);
      best[s] = std::max(best[s], tokens / *seconds);
      loss[s] = l;
    }
  }
  std::map<ShardingStrategy, double> bytes;
  for (ShardingStrategy s : Strategies()) {
    auto b = BytesPerParameter(s, group);
    if (!b.ok()) {
      std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
      return 1;
    }
    bytes[s] = *b;
  }
  if (group->rank() == 0) {
    const gpt::GPTConfig c = Config();
    std::printf(
        "GPT %d layers, hidden %d, %d heads, vocabulary %d, sequence %d, %s; "
        "DP %d, global batch %d (micro-batch %d); best of %d rounds of %d "
        "steps\n\n",
        c.num_layers, static_cast<int>(c.hidden_size), c.num_attention_heads,
        static_cast<int>(c.vocab_size), static_cast<int>(c.seq_length),
        absl::GetFlag(FLAGS_bf16) ? "bf16" : "fp32", n,
        absl::GetFlag(FLAGS_global_batch_size),
        absl::GetFlag(FLAGS_micro_batch_size), absl::GetFlag(FLAGS_rounds),
        absl::GetFlag(FLAGS_steps));
    std::printf(
        "| strategy | tokens/s | vs no_shard | last loss | bytes/param "
        "(bf16, Adam) | Megatron |\n|---|---|---|---|---|---|\n");
    for (ShardingStrategy s : Strategies()) {
      std::printf("| %s | %.0f | %.3f | %.6f | %.2f | %.2f |\n",
                  std::string(ShardingStrategyName(s)).c_str(), best[s],
                  best[s] / best[ShardingStrategy::kNoShard], loss[s], bytes[s],
                  Megatron(s, n));
    }
  }
  return 0;
}

// Starts the ranks (this binary again, with torchrun's variables, one
// thread each) and waits for them.
int Launch(char** argv) {
  const int n = absl::GetFlag(FLAGS_world);
  // Held until rank 0 serves the store on it (see PortReservation).
  mcc::comm::PortReservation reservation =
      mcc::comm::PortReservation::Listen("127.0.0.1", 0).value();
  const std::string port = std::to_string(reservation.port());
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      if (r == 0) reservation.HandToChild();
      const int threads =
          std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)) / n);
      setenv("MCC_NUM_THREADS", std::to_string(threads).c_str(), 1);
      setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
      setenv("OMP_WAIT_POLICY", "passive", 1);
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    pids.push_back(pid);
  }
  reservation.Release();
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}

}  // namespace
}  // namespace fsdp
}  // namespace mcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (std::getenv("WORLD_SIZE") == nullptr) return mcc::fsdp::Launch(argv);
  return mcc::fsdp::Worker();
}
