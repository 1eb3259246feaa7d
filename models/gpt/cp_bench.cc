// Context parallelism at long sequences, per rank (run under tools/launch
// with the CP size dividing the world; the other ranks are data-parallel):
//   - activation memory: the allocator's peak bytes above the model's own
//     while one micro-batch of --seq tokens runs forward and backward
//     through a small GPT (its activations held for the backward), and the
//     bytes still held when the forward ends;
//   - attention time: ring attention (or all-to-all) forward + backward of
//     this rank's chunks, its kernel time, the time spent waiting for
//     transfers, and the same transfers alone, so the share of the ring's
//     communication hidden behind computation is 1 - wait / alone.
// Rank 0 prints one line per measure: memory as the maximum over ranks,
// times as the mean over ranks (waiting includes a slower peer's lateness,
// so on a loaded machine the hidden share is a lower bound).
//
//   tools/bazel build //models/gpt:cp_bench //tools:launch
//   bazel-bin/tools/launch --nproc_per_node 4 --
//     bazel-bin/models/gpt/cp_bench --cp 2 --seq 8192
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/allocator.h"
#include "core/comm/init.h"
#include "core/comm/process_group.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "models/gpt/gpt_model.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/ulysses_attention.h"
#include "parallel/parallel_state.h"

ABSL_FLAG(int, cp, 1, "Context-parallel size (divides the world size).");
ABSL_FLAG(int64_t, seq, 8192, "Sequence length.");
ABSL_FLAG(int, layers, 2, "Layers of the model measured for memory.");
ABSL_FLAG(int64_t, hidden, 128, "Hidden size.");
ABSL_FLAG(int, heads, 4, "Attention heads.");
ABSL_FLAG(int, iters, 2, "Timed attention iterations (after one warm-up).");
ABSL_FLAG(bool, a2a, false, "Time the all-to-all mode instead of the ring.");

namespace mcc {
namespace {

// The maximum (or mean) of a value over the world, on every rank.
absl::StatusOr<double> MaxOverWorld(comm::ProcessGroup* world, double v) {
  Tensor t = Tensor::Full({1}, v, DType::kFloat32);
  MCC_RETURN_IF_ERROR(world->AllReduceSync(&t, comm::ReduceOp::kMax));
  return static_cast<double>(t.data<float>()[0]);
}
absl::StatusOr<double> MeanOverWorld(comm::ProcessGroup* world, double v) {
  Tensor t = Tensor::Full({1}, v, DType::kFloat32);
  MCC_RETURN_IF_ERROR(world->AllReduceSync(&t, comm::ReduceOp::kSum));
  return static_cast<double>(t.data<float>()[0]) / world->size();
}

absl::Status Memory(parallel::ParallelState* state, int64_t seq) {
  gpt::GPTConfig config;
  config.num_layers = absl::GetFlag(FLAGS_layers);
  config.hidden_size = absl::GetFlag(FLAGS_hidden);
  config.num_attention_heads = absl::GetFlag(FLAGS_heads);
  config.vocab_size = 1024;
  config.seq_length = seq;
  parallel::LayerContext ctx;
  ctx.cp_group = state->context()->size() > 1 ? state->context() : nullptr;
  if (absl::GetFlag(FLAGS_a2a)) {
    ctx.cp_comm_type = parallel::LayerContext::CpCommType::kAllToAll;
  }
  MCC_ASSIGN_OR_RETURN(auto model, gpt::GPTModel::Create(config, ctx));
  std::vector<int64_t> ids(seq);
  for (int64_t i = 0; i < seq; ++i) ids[i] = (i * 7919) % config.vocab_size;
  auto batches = std::make_shared<std::vector<gpt::MicroBatch>>(1);
  MCC_ASSIGN_OR_RETURN((*batches)[0].tokens, Tensor::FromInts(ids, {1, seq}));
  (*batches)[0].labels = (*batches)[0].tokens;
  model->SetMicroBatches(batches);

  Allocator* cpu = GetAllocator(Device::CPU());
  const int64_t before = cpu->Stats().current_bytes;
  cpu->ResetPeak();
  int64_t held = 0;
  {
    MCC_ASSIGN_OR_RETURN(parallel::StageOutput out,
                         model->ForwardStep(0, Tensor(), true));
    held = cpu->Stats().current_bytes - before;
    MCC_RETURN_IF_ERROR(
        model->BackwardStep(Tensor(), 1.0f, std::move(out.record)).status());
  }
  const int64_t peak = cpu->Stats().peak_bytes - before;
  MCC_ASSIGN_OR_RETURN(double max_peak,
                       MaxOverWorld(state->world(), static_cast<double>(peak)));
  MCC_ASSIGN_OR_RETURN(double max_held,
                       MaxOverWorld(state->world(), static_cast<double>(held)));
  if (state->world()->rank() == 0) {
    std::printf(
        "memory: seq %lld, CP %d, %d layers, hidden %lld: activation peak "
        "%.1f MiB per rank, %.1f MiB held after the forward\n",
        static_cast<long long>(seq), state->context()->size(),
        config.num_layers, static_cast<long long>(config.hidden_size),
        max_peak / (1 << 20), max_held / (1 << 20));
  }
  return absl::OkStatus();
}

// The ring's transfers alone, with the sizes ring attention sends: C - 1
// K/V blocks forward; C - 1 K/V blocks and C fp32 dK/dV blocks backward.
absl::StatusOr<double> RingTransfersAlone(comm::ProcessGroup* cp,
                                          const Shape& kv_shape, DType dtype) {
  const int c = cp->size();
  Shape block{4};
  block.insert(block.end(), kv_shape.begin(), kv_shape.end());
  Tensor kv = Tensor::Zeros(block, dtype), kv_in = Tensor::Zeros(block, dtype);
  Tensor g = Tensor::Zeros(block, DType::kFloat32);
  Tensor g_in = Tensor::Zeros(block, DType::kFloat32);
  const int next = (cp->rank() + 1) % c, prev = (cp->rank() + c - 1) % c;
  const absl::Time start = absl::Now();
  auto hop = [&](const Tensor& out, Tensor* in, uint32_t tag) {
    auto r = cp->Recv(in, prev, tag);
    auto s = cp->Send(out, next, tag);
    absl::Status st = r->Wait();
    st.Update(s->Wait());
    return st;
  };
  for (int i = 0; i + 1 < c; ++i) {
    MCC_RETURN_IF_ERROR(hop(kv, &kv_in, context_parallel::kKvTag));
  }
  for (int i = 0; i + 1 < c; ++i) {
    MCC_RETURN_IF_ERROR(hop(kv, &kv_in, context_parallel::kKvTag));
  }
  for (int i = 0; i < c; ++i) {
    MCC_RETURN_IF_ERROR(hop(g, &g_in, context_parallel::kGradTag));
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

absl::Status AttentionTime(parallel::ParallelState* state, int64_t seq) {
  comm::ProcessGroup* cp =
      state->context()->size() > 1 ? state->context() : nullptr;
  const int c = state->context()->size();
  const int heads = absl::GetFlag(FLAGS_heads);
  const int64_t d = absl::GetFlag(FLAGS_hidden) / heads;
  const int64_t l = seq / (2 * c);
  const bool a2a = absl::GetFlag(FLAGS_a2a);
  context_parallel::QkvChunks in;
  context_parallel::ChunkPair dout;
  for (int a = 0; a < 2; ++a) {
    in.q[a] = Tensor::Full({1, l, heads, d}, 0.01 * (a + 1), DType::kFloat32);
    in.k[a] = Tensor::Full({1, l, heads, d}, 0.02, DType::kFloat32);
    in.v[a] = Tensor::Full({1, l, heads, d}, 0.03, DType::kFloat32);
    dout[a] = Tensor::Full({1, l, heads, d}, 0.001, DType::kFloat32);
  }
  const int iters = absl::GetFlag(FLAGS_iters);
  double total = 0, compute = 0, wait = 0;
  for (int it = 0; it <= iters; ++it) {
    context_parallel::RingTimes fwd, bwd;
    context_parallel::ChunkPair out, lse;
    context_parallel::QkvChunks grads;
    const absl::Time start = absl::Now();
    if (a2a) {
      context_parallel::UlyssesRecord record;
      MCC_RETURN_IF_ERROR(context_parallel::UlyssesAttentionForward(
          cp, in, 0.0f, &out, &record));
      MCC_RETURN_IF_ERROR(context_parallel::UlyssesAttentionBackward(
          cp, record, dout, 0.0f, &grads));
    } else {
      MCC_RETURN_IF_ERROR(context_parallel::RingAttentionForward(
          cp, in, 0.0f, &out, &lse, &fwd));
      MCC_RETURN_IF_ERROR(context_parallel::RingAttentionBackward(
          cp, in, out, dout, lse, 0.0f, &grads, &bwd));
    }
    if (it == 0) continue;  // Warm-up.
    total += absl::ToDoubleSeconds(absl::Now() - start);
    compute += fwd.compute_seconds + bwd.compute_seconds;
    wait += fwd.wait_seconds + bwd.wait_seconds;
  }
  double alone = 0;
  if (cp != nullptr && !a2a) {
    for (int it = 0; it < iters; ++it) {
      MCC_ASSIGN_OR_RETURN(
          double t, RingTransfersAlone(cp, in.k[0].shape(), DType::kFloat32));
      alone += t;
    }
  }
  comm::ProcessGroup* w = state->world();
  const double hidden_here =
      alone > 0 ? std::max(0.0, 1.0 - wait / alone) : 0.0;
  MCC_ASSIGN_OR_RETURN(total, MeanOverWorld(w, total / iters));
  MCC_ASSIGN_OR_RETURN(compute, MeanOverWorld(w, compute / iters));
  MCC_ASSIGN_OR_RETURN(wait, MeanOverWorld(w, wait / iters));
  MCC_ASSIGN_OR_RETURN(alone, MeanOverWorld(w, alone / iters));
  MCC_ASSIGN_OR_RETURN(const double hidden, MeanOverWorld(w, hidden_here));
  if (w->rank() == 0) {
    std::printf(
        "attention (%s): seq %lld, CP %d, %d heads of %lld: %.3f s per "
        "forward+backward per rank (kernels %.3f s, waiting %.3f s); "
        "transfers alone %.3f s, hidden %.0f%%\n",
        a2a ? "a2a" : "ring", static_cast<long long>(seq), c, heads,
        static_cast<long long>(d), total, compute, wait, alone, 100.0 * hidden);
  }
  return absl::OkStatus();
}

absl::Status Run() {
  comm::GroupOptions options;
  options.timeout = absl::Minutes(10);
  MCC_ASSIGN_OR_RETURN(comm::World world,
                       comm::InitWorldFromEnvironment(options));
  parallel::ParallelSizes sizes;
  sizes.context = absl::GetFlag(FLAGS_cp);
  MCC_ASSIGN_OR_RETURN(auto state,
                       parallel::ParallelState::Create(world.group, sizes));
  const int64_t seq = absl::GetFlag(FLAGS_seq);
  MCC_RETURN_IF_ERROR(Memory(state.get(), seq));
  return AttentionTime(state.get(), seq);
}

}  // namespace
}  // namespace mcc

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = mcc::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "cp_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
