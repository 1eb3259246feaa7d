// Expert parallelism's token movement as a share of the MoE layer's time, at
// EP 2 and EP 4 (issue 41), in real processes over gloo as training runs
// them:
//
//   tools/bazel run -c opt //models/moe:moe_dispatch_bench [-- --ep 2,4]
//
// The binary starts EP ranks of itself (core/comm/mp_test_util.h's
// RunWorkers); each routes its own --tokens tokens through a MoeMlp holding
// E / EP experts (router with its balancing loss, permute, dispatch, grouped
// SwiGLU experts, combine, unpermute; forward and backward), for each
// dispatcher (alltoall, allgather) and dtype. Per rank and repetition:
//
//   layer      the forward + backward, by wall time and process CPU time;
//   in layer   the wall time spent inside the dispatcher (Plan, Dispatch,
//              Combine: the op profile's MoeDispatchPlan, MoeDispatch and
//              MoeCombine), waiting for slower ranks included;
//   replayed   the same movements again, alone (Plan, then Dispatch and
//              Combine twice: the forward's rows and the backward's
//              gradients, of the same sizes), by wall and CPU time.
//
// The replay's CPU time is the figure that holds on a loaded machine: each
// rank computes on one thread, so it counts the copies and the gloo threads'
// socket work and not other jobs. Wall-time shares need a quiet machine with
// a core per rank (EP 4 on 2 cores shares them even when idle). Before
// timing, each rank checks the replayed Dispatch against the rows the layer
// dispatched and that Combine brings them back bit for bit.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/op_profile.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "models/moe/bench_timer.h"
#include "models/moe/moe_mlp.h"

ABSL_FLAG(std::string, ep, "2,4", "Expert-parallel sizes (ranks started).");
ABSL_FLAG(std::string, dispatchers, "alltoall,allgather", "Dispatchers.");
ABSL_FLAG(std::string, dtypes, "fp32,bf16", "fp32 and/or bf16.");
ABSL_FLAG(int64_t, tokens, 2048, "Tokens per rank.");
ABSL_FLAG(int64_t, hidden, 512, "Hidden size.");
ABSL_FLAG(int64_t, experts, 8, "Experts (divisible by every EP).");
ABSL_FLAG(int64_t, topk, 2, "Experts per token.");
ABSL_FLAG(int64_t, ffn, 1408, "Each expert's ffn hidden size.");
ABSL_FLAG(int32_t, reps, 5, "Timed repetitions (medians taken).");
ABSL_FLAG(int32_t, timeout_s, 1200, "Seconds before the ranks are killed.");

namespace mcc {
namespace moe {
namespace {

int64_t EnvInt(const char* name) {
  const char* v = std::getenv(name);
  int64_t out = 0;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : 0;
}

Tensor Random(int64_t t, int64_t h, uint32_t seed, DType dtype) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(t * h);
  for (float& x : v) x = dist(gen);
  return *Tensor::FromVector(v, {t, h}, dtype);
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct Sample {
  BenchTime layer, replay;
  double in_layer_wall = 0;
};

// One dtype and dispatcher on this rank: prints a RESULT line of medians.
absl::Status MeasureOne(comm::ProcessGroup* group, DType dt,
                        TokenDispatcherType type) {
  const int64_t t = EnvInt("MOE_BENCH_TOKENS"), h = EnvInt("MOE_BENCH_HIDDEN");
  MoeMlpConfig c;
  c.hidden_size = h;
  c.num_experts = EnvInt("MOE_BENCH_EXPERTS");
  c.router.topk = EnvInt("MOE_BENCH_TOPK");
  c.ffn_hidden_size = EnvInt("MOE_BENCH_FFN");
  c.load_balancing = LoadBalancing::kAuxLoss;
  c.aux_loss_coeff = 1e-2f;
  c.dtype = dt;
  MCC_ASSIGN_OR_RETURN(auto moe, MoeMlp::Create("moe", c, {group, type}));
  MCC_ASSIGN_OR_RETURN(auto replay,
                       TokenDispatcher::Create(type, group, c.num_experts));
  const Tensor x = Random(t, h, 100 + group->rank(), dt);
  const Tensor dy = Random(t, h, 200 + group->rank(), dt);
  MoeMlp::Activations act;
  auto layer = [&]() -> absl::Status {
    act = MoeMlp::Activations();
    MCC_RETURN_IF_ERROR(moe->Forward(x, 1, &act).status());
    return moe->Backward(dy, act).status();
  };
  MCC_RETURN_IF_ERROR(layer());  // Warm-up.
  // The rows the layer sent, and what the experts received.
  MCC_ASSIGN_OR_RETURN(const Tensor sent, act.permuted.Slice(0, act.kept_rows));
  {
    MCC_ASSIGN_OR_RETURN(DispatchPlan plan,
                         replay->Plan(act.tokens_per_expert));
    MCC_ASSIGN_OR_RETURN(Tensor got, replay->Dispatch(sent, plan));
    MCC_ASSIGN_OR_RETURN(Tensor back, replay->Combine(got, plan));
    if (!SameBits(got, act.expert_in) || !SameBits(back, sent)) {
      return absl::InternalError(
          "the replayed Dispatch differs from the layer's, or Combine does "
          "not bring the rows back");
    }
  }
  std::vector<Sample> samples;
  for (int r = 0; r < EnvInt("MOE_BENCH_REPS"); ++r) {
    Sample s;
    MCC_RETURN_IF_ERROR(group->BarrierSync());
    OpProfile::Reset();
    OpProfile::Enable(true);
    absl::Status st;
    s.layer = TimeCall([&] { st = layer(); });
    OpProfile::Enable(false);
    MCC_RETURN_IF_ERROR(st);
    for (const OpProfile::Entry& e : OpProfile::Snapshot()) {
      if (e.op == "MoeDispatchPlan" || e.op == "MoeDispatch" ||
          e.op == "MoeCombine") {
        s.in_layer_wall += e.seconds;
      }
    }
    MCC_RETURN_IF_ERROR(group->BarrierSync());
    const Tensor local = act.expert_in;
    s.replay = TimeCall([&] {
      auto plan = replay->Plan(act.tokens_per_expert);
      st = plan.status();
      for (int pass = 0; pass < 2 && st.ok(); ++pass) {
        st.Update(replay->Dispatch(sent, *plan).status());
        st.Update(replay->Combine(local, *plan).status());
      }
    });
    MCC_RETURN_IF_ERROR(st);
    samples.push_back(s);
  }
  std::vector<BenchTime> layers, replays;
  std::vector<double> in_layer;
  for (const Sample& s : samples) {
    layers.push_back(s.layer);
    replays.push_back(s.replay);
    in_layer.push_back(s.in_layer_wall);
  }
  std::sort(in_layer.begin(), in_layer.end());
  const BenchTime l = Median(layers), d = Median(replays);
  // Bytes this rank sends to other ranks per Dispatch.
  const int64_t el = moe->local_experts(), me = group->rank();
  int64_t off_rank = 0;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    if (e / el != me) off_rank += act.tokens_per_expert[e];
  }
  std::printf(
      "RESULT %s %s layer_wall %.6f layer_cpu %.6f replay_wall %.6f "
      "replay_cpu %.6f in_layer_wall %.6f local_rows %lld sent_mib %.3f\n",
      std::string(DTypeName(dt)).c_str(), TokenDispatcherTypeName(type), l.wall,
      l.cpu, d.wall, d.cpu, in_layer[in_layer.size() / 2],
      static_cast<long long>(act.expert_in.size(0)),
      off_rank * h * DTypeSize(dt) / 1048576.0);
  std::fflush(stdout);
  return absl::OkStatus();
}

MCC_WORKER(moe_dispatch) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(600);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok())
    return comm::testing::ReportFailure("init", world.status(), 3);
  ThreadPool::SetGlobalThreads(1);
  for (absl::string_view dtn : absl::StrSplit(std::getenv("MOE_BENCH_DTYPES"),
                                              ',', absl::SkipEmpty())) {
    const DType dt = dtn == "bf16" ? DType::kBFloat16 : DType::kFloat32;
    for (absl::string_view name : absl::StrSplit(
             std::getenv("MOE_BENCH_DISPATCHERS"), ',', absl::SkipEmpty())) {
      auto type = ParseTokenDispatcherType(name);
      if (!type.ok())
        return comm::testing::ReportFailure("flag", type.status(), 2);
      const absl::Status st = MeasureOne(world->group.get(), dt, *type);
      if (!st.ok()) return comm::testing::ReportFailure("measure", st, 4);
    }
  }
  return 0;
}

struct RankResult {
  double layer_wall, layer_cpu, replay_wall, replay_cpu, in_layer_wall;
  int64_t local_rows;
  double sent_mib;
};

// RESULT lines of every rank, keyed by "dtype dispatcher".
std::map<std::string, std::vector<RankResult>> Parse(
    const std::vector<comm::testing::WorkerResult>& results) {
  std::map<std::string, std::vector<RankResult>> out;
  for (const auto& w : results) {
    std::istringstream lines(w.output);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("RESULT ", 0) != 0) continue;
      std::istringstream in(line);
      std::string tag, dt, disp, k;
      RankResult r;
      long long rows = 0;
      in >> tag >> dt >> disp >> k >> r.layer_wall >> k >> r.layer_cpu >> k >>
          r.replay_wall >> k >> r.replay_cpu >> k >> r.in_layer_wall >> k >>
          rows >> k >> r.sent_mib;
      r.local_rows = rows;
      out[dt + " " + disp].push_back(r);
    }
  }
  return out;
}

int Run() {
  std::printf(
      "tokens %lld per rank, hidden %lld, %lld experts top-%lld, expert ffn "
      "%lld; one thread per rank; medians of %d repetitions\n",
      static_cast<long long>(absl::GetFlag(FLAGS_tokens)),
      static_cast<long long>(absl::GetFlag(FLAGS_hidden)),
      static_cast<long long>(absl::GetFlag(FLAGS_experts)),
      static_cast<long long>(absl::GetFlag(FLAGS_topk)),
      static_cast<long long>(absl::GetFlag(FLAGS_ffn)),
      absl::GetFlag(FLAGS_reps));
  std::printf("\n%-2s %-4s %-9s | %-30s | %-30s | %s\n", "EP", "", "",
              "CPU time", "wall", "in layer");
  std::printf("%-2s %-4s %-9s | %8s %10s %9s | %8s %10s %9s | %9s | %s\n", "",
              "", "", "layer ms", "d+c ms", "share", "layer ms", "d+c ms",
              "share", "share", "sent MiB, rows per rank (min-max)");
  for (absl::string_view ep_text :
       absl::StrSplit(absl::GetFlag(FLAGS_ep), ',', absl::SkipEmpty())) {
    int ep = 0;
    if (!absl::SimpleAtoi(ep_text, &ep) || ep < 2) {
      std::fprintf(stderr, "--ep: '%s' is not a size of 2 or more\n",
                   std::string(ep_text).c_str());
      return 2;
    }
    const auto results = comm::testing::RunWorkers(
        ep, "moe_dispatch", absl::Seconds(absl::GetFlag(FLAGS_timeout_s)),
        [&](int) {
          return std::map<std::string, std::string>{
              {"MOE_BENCH_TOKENS", absl::StrCat(absl::GetFlag(FLAGS_tokens))},
              {"MOE_BENCH_HIDDEN", absl::StrCat(absl::GetFlag(FLAGS_hidden))},
              {"MOE_BENCH_EXPERTS", absl::StrCat(absl::GetFlag(FLAGS_experts))},
              {"MOE_BENCH_TOPK", absl::StrCat(absl::GetFlag(FLAGS_topk))},
              {"MOE_BENCH_FFN", absl::StrCat(absl::GetFlag(FLAGS_ffn))},
              {"MOE_BENCH_REPS", absl::StrCat(absl::GetFlag(FLAGS_reps))},
              {"MOE_BENCH_DTYPES", absl::GetFlag(FLAGS_dtypes)},
              {"MOE_BENCH_DISPATCHERS", absl::GetFlag(FLAGS_dispatchers)},
              {"MCC_NUM_THREADS", "1"},
          };
        });
    for (const auto& w : results) {
      if (w.exit_code != 0) {
        std::fprintf(stderr, "EP %d failed:\n%s\n", ep,
                     comm::testing::Describe(results).c_str());
        return 1;
      }
    }
    for (const auto& [key, ranks] : Parse(results)) {
      // Means over the ranks of each rank's medians.
      RankResult m{};
      int64_t rows_lo = ranks[0].local_rows, rows_hi = rows_lo;
      double mib_lo = ranks[0].sent_mib, mib_hi = mib_lo;
      for (const RankResult& r : ranks) {
        m.layer_wall += r.layer_wall / ranks.size();
        m.layer_cpu += r.layer_cpu / ranks.size();
        m.replay_wall += r.replay_wall / ranks.size();
        m.replay_cpu += r.replay_cpu / ranks.size();
        m.in_layer_wall += r.in_layer_wall / ranks.size();
        rows_lo = std::min(rows_lo, r.local_rows);
        rows_hi = std::max(rows_hi, r.local_rows);
        mib_lo = std::min(mib_lo, r.sent_mib);
        mib_hi = std::max(mib_hi, r.sent_mib);
      }
      const size_t space = key.find(' ');
      std::printf(
          "%-2d %-4s %-9s | %8.1f %10.1f %8.1f%% | %8.1f %10.1f %8.1f%% | "
          "%8.1f%% | %.2f-%.2f, %lld-%lld\n",
          ep, key.substr(0, space).c_str(), key.substr(space + 1).c_str(),
          1e3 * m.layer_cpu, 1e3 * m.replay_cpu,
          100.0 * m.replay_cpu / m.layer_cpu, 1e3 * m.layer_wall,
          1e3 * m.replay_wall, 100.0 * m.replay_wall / m.layer_wall,
          100.0 * m.in_layer_wall / m.layer_wall, mib_lo, mib_hi,
          static_cast<long long>(rows_lo), static_cast<long long>(rows_hi));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace moe
}  // namespace mcc

int main(int argc, char** argv) {
  const int worker = mcc::comm::testing::MaybeRunWorker(argc, argv);
  if (worker >= 0) return worker;
  absl::ParseCommandLine(argc, argv);
  return mcc::moe::Run();
}
