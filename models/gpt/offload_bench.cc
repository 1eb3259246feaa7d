// Activation offloading (--cpu-offloading) in one process: a GPT's forward
// and backward per micro-batch with 0, then each --offload value, of its
// first layers offloaded; per setting the fastest step time of --steps
// (after one warm-up), the peak device memory of a step (the device
// allocator's), the bytes offloaded per micro-batch, and whether the
// losses and gradients equal the run without offloading bit for bit.
//
//   tools/bazel build //models/gpt:offload_bench
//   bazel-bin/models/gpt/offload_bench --device testdev      # CI's device
//   bazel-bin/models/gpt/offload_bench --device cuda --layers 12 \
//       --hidden 768 --heads 12 --seq 1024 --batch 8 --offload 4,8
//
// On the test device copies are synchronous (it has no side stream), so
// its times show the cost of the copies, not their overlap; on a GPU they
// run on a side stream.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/allocator.h"
#include "core/comm/process_group.h"
#include "core/cuda/runtime.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "models/gpt/gpt_model.h"

ABSL_FLAG(std::string, device, "testdev", "testdev or cuda (cuda:0).");
ABSL_FLAG(int, layers, 4, "Transformer layers.");
ABSL_FLAG(int64_t, hidden, 128, "Hidden size.");
ABSL_FLAG(int, heads, 4, "Attention heads.");
ABSL_FLAG(int64_t, seq, 128, "Sequence length.");
ABSL_FLAG(int64_t, batch, 4, "Micro-batch size.");
ABSL_FLAG(int64_t, vocab, 512, "Vocabulary size.");
ABSL_FLAG(bool, bf16, false, "bf16 activations (fp32 otherwise).");
ABSL_FLAG(std::string, offload, "2,4",
          "Comma-separated --cpu-offloading-num-layers values to compare "
          "with 0.");
ABSL_FLAG(int, steps, 3, "Timed micro-batches per setting.");

namespace mcc {
namespace gpt {
namespace {

struct Result {
  double seconds = 0;  // Fastest step.
  int64_t peak = 0;
  int64_t offloaded = 0;  // Bytes per micro-batch.
  std::vector<std::vector<char>> grads;
  std::vector<double> losses;
  bool asynchronous = false;
};

absl::StatusOr<Result> Measure(const GPTConfig& config, Device device,
                               DType dtype, const MicroBatch& batch) {
  parallel::LayerContext ctx;
  ctx.device = device;
  ctx.dtype = dtype;
  ctx.seed = config.seed;
  MCC_ASSIGN_OR_RETURN(auto model, GPTModel::Create(config, ctx));
  Allocator* allocator = GetAllocator(device);
  Result r;
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int step = 0; step <= steps; ++step) {
    allocator->ResetPeak();
    const auto start = std::chrono::steady_clock::now();
    // Returns after reading the loss to the host: the step is done.
    MCC_ASSIGN_OR_RETURN(LossSum loss, model->ForwardBackward(batch, 1.0f));
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    r.losses.push_back(loss.sum);
    if (step == 0) continue;  // Warm-up.
    r.seconds = r.seconds == 0 ? s : std::min(r.seconds, s);
    r.peak = std::max(r.peak, allocator->Stats().peak_bytes);
  }
  for (const auto& p : model->parameters()) {
    MCC_ASSIGN_OR_RETURN(Tensor g, p->main_grad.To(Device::CPU()));
    const char* bytes = static_cast<const char*>(g.raw_data());
    r.grads.emplace_back(bytes, bytes + g.nbytes());
  }
  r.offloaded = model->offload_stats().bytes / (steps + 1);
  return r;
}

absl::Status Run() {
  const std::string name = absl::GetFlag(FLAGS_device);
  Device device;
  if (name == "testdev") {
    device = Device::TestDevice();
  } else if (name == "cuda" || name == "cuda:0") {
    device = Device::CUDA(0);
    MCC_RETURN_IF_ERROR(cuda::CheckDeviceIndex(0));
  } else {
    return absl::InvalidArgumentError("--device: testdev or cuda");
  }
  GPTConfig c;
  c.num_layers = absl::GetFlag(FLAGS_layers);
  c.hidden_size = absl::GetFlag(FLAGS_hidden);
  c.num_attention_heads = absl::GetFlag(FLAGS_heads);
  c.seq_length = absl::GetFlag(FLAGS_seq);
  c.vocab_size = absl::GetFlag(FLAGS_vocab);
  const int64_t b = absl::GetFlag(FLAGS_batch);
  std::mt19937 rng(1);
  std::vector<int64_t> tokens(b * c.seq_length), labels(tokens.size());
  for (auto& t : tokens) t = rng() % c.vocab_size;
  for (auto& t : labels) t = rng() % c.vocab_size;
  MicroBatch batch;
  MCC_ASSIGN_OR_RETURN(Tensor host_tokens,
                       Tensor::FromInts(tokens, {b, c.seq_length}));
  MCC_ASSIGN_OR_RETURN(Tensor host_labels,
                       Tensor::FromInts(labels, {b, c.seq_length}));
  MCC_ASSIGN_OR_RETURN(batch.tokens, host_tokens.To(device));
  MCC_ASSIGN_OR_RETURN(batch.labels, host_labels.To(device));
  const DType dtype =
      absl::GetFlag(FLAGS_bf16) ? DType::kBFloat16 : DType::kFloat32;

  std::vector<int> settings = {-1};
  for (absl::string_view v :
       absl::StrSplit(absl::GetFlag(FLAGS_offload), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(v, &n)) {
      return absl::InvalidArgumentError("--offload: comma-separated integers");
    }
    settings.push_back(n);
  }
  std::printf(
      "activation offloading on %s: %d layers, hidden %lld, seq %lld, "
      "batch %lld, %s\n",
      device.ToString().c_str(), c.num_layers,
      static_cast<long long>(c.hidden_size),
      static_cast<long long>(c.seq_length), static_cast<long long>(b),
      DTypeName(dtype));
  std::printf("%-9s %10s %12s %14s %10s %s\n", "offload", "ms/step", "peak",
              "offloaded/mb", "peak drop", "same bits");
  // One whole run first: one-time costs (threads, GEMM code generation)
  // would otherwise fall on the first setting.
  MCC_RETURN_IF_ERROR(Measure(c, device, dtype, batch).status());
  Result base;
  for (int n : settings) {
    GPTConfig run = c;
    run.cpu_offloading = n >= 0;
    run.cpu_offloading_num_layers = std::max(0, n);
    MCC_ASSIGN_OR_RETURN(Result r, Measure(run, device, dtype, batch));
    if (n < 0) base = r;
    const bool same = r.grads == base.grads && r.losses == base.losses;
    std::printf("%-9d %10.2f %12s %14s %10s %s\n", std::max(0, n),
                r.seconds * 1e3, FormatBytes(r.peak).c_str(),
                FormatBytes(r.offloaded).c_str(),
                FormatBytes(base.peak - r.peak).c_str(), same ? "yes" : "NO");
    if (!same) {
      return absl::InternalError(
          "offloading changed the losses or the gradients");
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace gpt
}  // namespace mcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = mcc::gpt::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "offload_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
