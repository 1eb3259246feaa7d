// One decoding step of the inference engine's model (ModelRunner::Run) at
// 1, 8, 32 and 64 sequences, on tools/bench:serve's model (4 layers, hidden
// 512, 8 heads, vocabulary 512), fp32 and int8 weights, in one process: the
// engine's throughput without HTTP, scheduling or the load generator, and
// robust to a loaded machine (the minimum and median over many steps).
//   tools/bazel run //inference:decode_step_bench [-- THREADS [POSITION
//   [ONLY_SEQUENCES]]]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "core/thread_pool.h"
#include "inference/inference_weights.h"
#include "inference/model_runner.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/int8_quantization.h"

namespace mcc {
namespace inference {
namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

double CpuMs() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

// Milliseconds of one step at `sequences` rows, each at `position`: wall
// time (min and median over about a second of steps) and the process's CPU
// time (median; the pool's threads sleep when idle, so on a machine shared
// with other jobs this is the step's work, not its waiting).
void Bench(ModelRunner* runner, int64_t sequences, int64_t position,
           int64_t vocab, double* min_ms, double* median_ms, double* cpu_ms) {
  const int64_t block = runner->cache().shape().block_size;
  StepRows rows;
  for (int64_t s = 0; s < sequences; ++s) {
    BlockTable table;
    if (!runner->cache().Allocate(position / block + 1, &table)) {
      std::fprintf(stderr, "KV cache too small\n");
      std::exit(1);
    }
    rows.tables.push_back(std::move(table));
    rows.tokens.push_back(s % vocab);
    rows.positions.push_back(position);
    rows.table.push_back(static_cast<int32_t>(s));
    rows.logit_rows.push_back(static_cast<int32_t>(s));
  }
  std::vector<double> ms, cpu;
  std::vector<float> hidden;
  const absl::Time end = absl::Now() + absl::Seconds(2);
  while (ms.size() < 5 || absl::Now() < end) {
    const double c0 = CpuMs();
    const absl::Time t0 = absl::Now();
    Check(runner->Run(rows, &hidden).status());
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    cpu.push_back(CpuMs() - c0);
  }
  for (BlockTable& t : rows.tables) runner->cache().Free(&t);
  std::sort(ms.begin(), ms.end());
  *min_ms = ms.front();
  *median_ms = ms[ms.size() / 2];
  std::sort(cpu.begin(), cpu.end());
  *cpu_ms = cpu[cpu.size() / 2];
}

}  // namespace
}  // namespace inference
}  // namespace mcc

int main(int argc, char** argv) {
  using namespace mcc;             // NOLINT
  using namespace mcc::inference;  // NOLINT
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t position = argc > 2 ? std::atoll(argv[2]) : 64;
  // Only this many sequences (0: all), e.g. to profile one point.
  const int64_t only = argc > 3 ? std::atoll(argv[3]) : 0;
  // Microseconds the pool's idle workers poll before sleeping (tools/serve's
  // --spin-wait-us).
  const int64_t spin_us = argc > 4 ? std::atoll(argv[4]) : 0;
  if (threads > 0) ThreadPool::SetGlobalThreads(threads);
  ThreadPool::Global().SetSpinMicros(spin_us);
  gpt::GPTConfig config;
  config.num_layers = 4;
  config.hidden_size = 512;
  config.num_attention_heads = 8;
  config.vocab_size = 512;
  config.seq_length = 256;
  config.seed = 1;
  std::printf(
      "%d threads, every sequence at position %lld, workers poll %lld us\n",
      ThreadPool::Global().num_threads(), static_cast<long long>(position),
      static_cast<long long>(spin_us));
  std::printf(
      "| weights | sequences | step ms (min) | step ms (median) | tokens/s "
      "(median) | x one sequence | CPU ms per step (median) | tokens per "
      "CPU-s | x one sequence |\n|---|---|---|---|---|---|---|---|---|\n");
  for (bool int8 : {false, true}) {
    parallel::LayerContext ctx;
    ctx.seed = config.seed;
    auto model = gpt::GPTModel::Create(config, ctx);
    Check(model.status());
    if (int8) Check(gpt::QuantizeLinearWeightsInt8(model->get()));
    auto weights = LoadInferenceWeights(**model);
    Check(weights.status());
    KvCacheShape shape;
    shape.num_layers = config.num_layers;
    shape.kv_heads = weights->local_groups;
    shape.head_dim = config.head_dim();
    shape.block_size = 16;
    ModelRunner runner(
        std::move(*weights), nullptr,
        PagedKvCache::WithBlocks(shape, 64 * (position / 16 + 1)));
    double one = 0, one_cpu = 0;
    for (int64_t sequences : {1, 8, 32, 64}) {
      if (only > 0 && sequences != only) continue;
      double min_ms = 0, median_ms = 0, cpu_ms = 0;
      Bench(&runner, sequences, position, config.vocab_size, &min_ms,
            &median_ms, &cpu_ms);
      const double rate = sequences / median_ms * 1e3;
      const double cpu_rate = sequences / cpu_ms * 1e3;
      if (sequences == 1) one = rate, one_cpu = cpu_rate;
      std::printf(
          "| %s | %lld | %.2f | %.2f | %.0f | %.2f | %.2f | %.0f | %.2f |\n",
          int8 ? "int8" : "fp32", static_cast<long long>(sequences), min_ms,
          median_ms, rate, one > 0 ? rate / one : 0.0, cpu_ms, cpu_rate,
          one_cpu > 0 ? cpu_rate / one_cpu : 0.0);
    }
  }
  return 0;
}
