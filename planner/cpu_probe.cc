#include "planner/cpu_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/comm/gloo_process_group.h"
#include "core/comm/tcp_store.h"
#include "core/ops/attention.h"
#include "core/ops/gemm.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "glog/logging.h"
#include "planner/param_count.h"

namespace mcc {
namespace planner {
namespace {

// Appends the rate of each `work`-sized call of `run` over about `budget`
// (at least four calls; the first, a warm-up, is not counted) to *rates.
// False when a call fails. `on_this_thread`: the call's work runs on the
// calling thread (else it is timed by the wall clock whatever
// MCC_PROBE_CLOCK says).
template <typename Fn>
bool CallRates(double work, absl::Duration budget, Fn& run,
               std::vector<double>* rates, bool on_this_thread = true) {
  const absl::Time start = absl::Now();
  for (int i = 0; i < 1000; ++i) {
    const double t0 = ProbeClockSeconds(on_this_thread);
    if (!run()) return false;
    const double s = ProbeClockSeconds(on_this_thread) - t0;
    if (i > 0 && s > 0) rates->push_back(work / s);
    if (i >= 3 && absl::Now() - start > budget) break;
  }
  return true;
}

// The upper median (of an even count, the larger middle value).
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Best rate of `work`-sized calls of `run` over about `budget`.
template <typename Fn>
double BestRate(double work, absl::Duration budget, Fn run,
                bool on_this_thread = true) {
  std::vector<double> rates;
  if (!CallRates(work, budget, run, &rates, on_this_thread) || rates.empty()) {
    return 0;
  }
  return *std::max_element(rates.begin(), rates.end());
}

// The median rate of `work`-sized calls while `workers` threads each make
// them at once for about `budget` (each thread's first call is a warm-up):
// what a rank sustains while the other ranks on its cores compute too, as
// they do in training (a lone rank's best call was 13% faster than the
// GEMMs of a 2-rank training step). `make` builds one worker's call (its own
// buffers).
template <typename Make>
double ConcurrentMedianRate(int workers, double work, absl::Duration budget,
                            Make make) {
  std::vector<std::vector<double>> rates(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      auto run = make();
      // A failed call ends this worker; its rates so far still count.
      CallRates(work, budget, run, &rates[w]);
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<double> all;
  for (const std::vector<double>& r : rates) {
    all.insert(all.end(), r.begin(), r.end());
  }
  return Median(std::move(all));
}

DType GemmInput(DType dtype) {
  return dtype == DType::kFloat32 ? DType::kFloat32 : DType::kBFloat16;
}

double GemmRate(int64_t m, int64_t k, int64_t n, DType dtype) {
  Tensor a = Tensor::Full({m, k}, 0.5, GemmInput(dtype));
  Tensor b = Tensor::Full({k, n}, 0.25, GemmInput(dtype));
  Tensor c = Tensor::Empty({m, n}, DType::kFloat32);
  return BestRate(2.0 * m * k * n, absl::Milliseconds(400),
                  [&] { return ops::Gemm(a, false, b, false, &c).ok(); });
}

// The model-shaped GEMM's sustained rate with `workers` ranks computing.
double ConcurrentGemmRate(int workers, int64_t m, int64_t k, int64_t n,
                          DType dtype) {
  return ConcurrentMedianRate(
      workers, 2.0 * m * k * n, absl::Milliseconds(400), [&] {
        auto a = std::make_shared<Tensor>(
            Tensor::Full({m, k}, 0.5, GemmInput(dtype)));
        auto b = std::make_shared<Tensor>(
            Tensor::Full({k, n}, 0.25, GemmInput(dtype)));
        auto c =
            std::make_shared<Tensor>(Tensor::Empty({m, n}, DType::kFloat32));
        return
            [a, b, c] { return ops::Gemm(*a, false, *b, false, c.get()).ok(); };
      });
}

// One GEMM of a training step: C[m, n] = op(A) op(B), as parallel/linear.cc
// calls it.
struct GemmShape {
  int64_t m, n, k;
  bool trans_a, trans_b;
  bool accumulate;  // Into an fp32 main gradient (beta 1).
};

// The GEMMs of one transformer layer (`output_layer` false) or of the
// output layer at TP degree `tp` on `rows` rows: for each linear layer (out
// x in, split over TP) the forward (x w^T), the input gradient (dy w) and
// the weight gradient accumulated into fp32 (dy^T x). Empty when the model
// cannot be split over `tp` (GPTConfig::Validate).
std::vector<GemmShape> ModelGemms(const gpt::GPTConfig& c, int tp, int64_t rows,
                                  bool output_layer) {
  if (!c.Validate(tp, /*sequence_parallel=*/false).ok()) return {};
  std::vector<std::pair<int64_t, int64_t>> linears;
  if (output_layer) {
    linears = {{c.padded_vocab_size(tp) / tp, c.hidden_size}};
  } else {
    for (const LinearShape& l : LayerLinears(c)) {
      linears.push_back({l.OutPerRank(tp), l.InPerRank(tp)});
    }
  }
  std::vector<GemmShape> gemms;
  for (const auto& [out, in] : linears) {
    gemms.push_back({rows, out, in, false, true, false});
    gemms.push_back({rows, in, out, false, false, false});
    gemms.push_back({out, in, rows, true, false, true});
  }
  return gemms;
}

double Flops(const std::vector<GemmShape>& gemms) {
  double flops = 0;
  for (const GemmShape& g : gemms) flops += 2.0 * g.m * g.n * g.k;
  return flops;
}

// Elements of the weight-sized operand of each of `gemms`: the weight a
// forward or input-gradient GEMM reads (its B), the gradient a
// weight-gradient GEMM accumulates into (its C).
double WeightElements(const std::vector<GemmShape>& gemms) {
  double elements = 0;
  for (const GemmShape& g : gemms) {
    elements += g.accumulate ? 1.0 * g.m * g.n : 1.0 * g.k * g.n;
  }
  return elements;
}

// The FLOP rate of `gemms` run one after another, with `workers` ranks each
// running them at once (the median over calls, as ConcurrentGemmRate).
double GemmListRate(int workers, const std::vector<GemmShape>& gemms,
                    DType dtype,
                    absl::Duration budget = absl::Milliseconds(1000)) {
  const double flops = Flops(gemms);
  const DType in = GemmInput(dtype);
  return ConcurrentMedianRate(workers, flops, budget, [&] {
    auto tensors = std::make_shared<std::vector<Tensor>>();
    for (const GemmShape& g : gemms) {
      tensors->push_back(g.trans_a ? Tensor::Full({g.k, g.m}, 0.5, in)
                                   : Tensor::Full({g.m, g.k}, 0.5, in));
      tensors->push_back(g.trans_b ? Tensor::Full({g.n, g.k}, 0.25, in)
                                   : Tensor::Full({g.k, g.n}, 0.25, in));
      tensors->push_back(g.accumulate
                             ? Tensor::Full({g.m, g.n}, 0, DType::kFloat32)
                             : Tensor::Empty({g.m, g.n}, in));
    }
    return [tensors, gemms] {
      std::vector<Tensor>& t = *tensors;
      for (size_t i = 0; i < gemms.size(); ++i) {
        const GemmShape& g = gemms[i];
        if (!ops::Gemm(t[3 * i], g.trans_a, t[3 * i + 1], g.trans_b,
                       &t[3 * i + 2], 1.0f, g.accumulate ? 1.0f : 0.0f)
                 .ok()) {
          return false;
        }
      }
      return true;
    };
  });
}

double AttentionRate(const gpt::GPTConfig& model, DType dtype, int workers) {
  // Capped, so a large model's probe stays well under a second a call.
  const int64_t s = std::min<int64_t>(model.seq_length, 1024);
  const int64_t heads = std::min(model.num_attention_heads, 8);
  const int64_t d = model.head_dim();
  const DType t = dtype == DType::kFloat32 ? DType::kFloat32 : dtype;
  const double flops = 0.5 * 4.0 * s * s * heads * d;
  return ConcurrentMedianRate(workers, flops, absl::Milliseconds(300), [&] {
    auto q = std::make_shared<Tensor>(Tensor::Full({1, s, heads, d}, 0.1, t));
    auto out = std::make_shared<Tensor>(Tensor::Empty(q->shape(), t));
    auto lse =
        std::make_shared<Tensor>(Tensor::Empty({1, heads, s}, DType::kFloat32));
    return [q, out, lse] {
      ops::AttentionOptions options;
      options.causal = true;
      return ops::FlashAttentionForward(*q, *q, *q, options, out.get(),
                                        lse.get())
          .ok();
    };
  });
}

// Bytes read plus written per second, copying 64 MiB per core at once.
double CopyBandwidth() {
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  const size_t bytes = size_t{64} << 20;
  std::vector<std::vector<char>> src(threads, std::vector<char>(bytes, 1));
  std::vector<std::vector<char>> dst(threads, std::vector<char>(bytes, 0));
  return BestRate(
      2.0 * bytes * threads, absl::Milliseconds(300),
      [&] {
        std::vector<std::thread> pool;
        for (int i = 0; i < threads; ++i) {
          pool.emplace_back(
              [&, i] { std::memcpy(dst[i].data(), src[i].data(), bytes); });
        }
        for (std::thread& t : pool) t.join();
        return true;
      },
      /*on_this_thread=*/false);
}

// One direction of a TCP connection on 127.0.0.1: bytes per second and the
// round trip of one byte.
void Loopback(double* bandwidth, double* latency) {
  *bandwidth = 0;
  *latency = 0;
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 ||
      bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listener >= 0) close(listener);
    return;
  }
  int client = socket(AF_INET, SOCK_STREAM, 0);
  if (client < 0 ||
      connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(listener);
    if (client >= 0) close(client);
    return;
  }
  int server = accept(listener, nullptr, nullptr);
  close(listener);
  if (server < 0) {
    close(client);
    return;
  }
  int one = 1;
  setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const size_t total = size_t{64} << 20, chunk = size_t{1} << 20;
  std::vector<char> buf(chunk, 7), sink(chunk);
  auto read_all = [](int fd, char* p, size_t n) {
    while (n > 0) {
      ssize_t r = read(fd, p, n);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  };
  auto write_all = [](int fd, const char* p, size_t n) {
    while (n > 0) {
      ssize_t w = write(fd, p, n);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  };
  const absl::Time t0 = absl::Now();
  std::thread sender([&] {
    for (size_t sent = 0; sent < total; sent += chunk) {
      if (!write_all(client, buf.data(), chunk)) return;
    }
  });
  bool ok = true;
  for (size_t got = 0; got < total && ok; got += chunk) {
    ok = read_all(server, sink.data(), chunk);
  }
  sender.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  if (ok && seconds > 0) *bandwidth = total / seconds;
  // Round trips of one byte.
  char c = 1;
  const int trips = 200;
  const absl::Time r0 = absl::Now();
  for (int i = 0; i < trips && ok; ++i) {
    ok = write_all(client, &c, 1) && read_all(server, &c, 1) &&
         write_all(server, &c, 1) && read_all(client, &c, 1);
  }
  if (ok) *latency = absl::ToDoubleSeconds(absl::Now() - r0) / trips / 2;
  close(client);
  close(server);
}

// Collectives of the TP size (1-32 MiB) a probe round times between GEMMs.
constexpr int kPerRound = 8;

// gloo's collectives among `ranks` threads of this process over loopback,
// the transport train's CPU ranks use, every rank on its own thread as the
// node's ranks are (so they share the cores as they will), in groups of
// `group_size` consecutive ranks that all run the same loop at once (as a
// layout's TP or pipeline groups do), each collective after a model-shaped
// fp32 GEMM as in training and back to back: per-rank bandwidths of an
// all-gather and an all-reduce of 16 MiB (or `bytes`, if more) back to back,
// and the latency of one ring step (what a TP-sized gather between GEMMs
// leaves after its bytes at that rate; at least a 4-byte all-reduce's). Medians
// over `rounds` rounds, seen from rank 0: the probe's noise falls with them
// (the whole node: TP 4's predicted step over six probes 3.3-4.1 s with 8
// rounds, 3.4-3.8 s with 16; pairs: TP 2 x DP 2's 2.24-2.81 s over five probes
// with 12 rounds, 2.40-2.76 s over eight with 24, the pairs' step
// latency 1.4-3.3 ms against 1.9-2.8). (A fit through two message sizes, tried
// to split the per-collective cost from the per-byte one, gave bandwidths from
// 0.5 to 28 GB/s between runs: too noisy here.) Measured on a 2-core VM: the
// same collectives on idle ranks ran at 2 GB/s (the single loopback connection
// the probe used before: 2.9 GB/s), but TP 2's 2 MB all-gathers and
// reduce-scatters between its GEMMs took 2.6 ms each in training (a ~0.4 GB/s
// rate): the ranks arrive apart, the collective thread must be woken, and the
// copies run on cores that were computing. The GEMMs between are fp32 whatever
// the model's type: bf16 training's collectives cost as much as fp32's (4 ranks
// on 2 cores, TP 2 x DP 2: 0.9-1.0 s a step outside ops in bf16, 0.7 s in
// fp32), since attention and the memory-bound ops between them do not get
// faster, but bf16 GEMMs between the probe's collectives halved its latency.
struct CollectiveRates {
  double gather_bandwidth = 0;
  double reduce_bandwidth = 0;
  double latency = 0;
};

absl::StatusOr<CollectiveRates> MeasureGlooCollectives(
    int ranks, int group_size, int64_t bytes, int64_t gemm_rows,
    int64_t gemm_width, int rounds) {
  comm::TcpStore::Options store_options;
  store_options.host = "127.0.0.1";
  store_options.port = 0;
  store_options.is_server = true;
  store_options.timeout = absl::Seconds(60);
  MCC_ASSIGN_OR_RETURN(std::shared_ptr<comm::TcpStore> server,
                       comm::TcpStore::Connect(store_options));
  std::vector<std::shared_ptr<comm::Store>> stores = {server};
  for (int r = 1; r < ranks; ++r) {
    MCC_ASSIGN_OR_RETURN(std::shared_ptr<comm::TcpStore> clone,
                         server->Clone());
    stores.push_back(std::move(clone));
  }
  // Whole fp32 elements, a multiple of the group size.
  const int gs = group_size;
  const int64_t elements = std::max<int64_t>(gs, bytes / 4 / gs * gs);
  // The bandwidths come from 16 MiB messages back to back, whose time is
  // mostly bytes: at 1 MiB, less the steps' latency, a gather's rate moved
  // from 0.44 to 2.6 GB/s between probes a minute apart (2 ranks, 2-core
  // VM), and gradient buckets are large.
  const int64_t big = std::max<int64_t>(elements, (int64_t{4} << 20) / gs * gs);
  constexpr int kSmall = 20, kBigPerRound = 2;
  std::vector<double> small_s, gather_s, big_gather_s, big_reduce_s;
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      comm::GroupOptions options;
      options.timeout = absl::Seconds(60);
      options.debug_collectives = false;
      const int first = r / gs * gs;
      std::vector<int> members(gs);
      for (int i = 0; i < gs; ++i) members[i] = first + i;
      const std::string name = absl::StrCat("planner_probe_", first);
      auto group = comm::CreateGlooProcessGroup(
          std::make_shared<comm::PrefixStore>(name, stores[r]), r - first, gs,
          name, members, options);
      if (!group.ok()) {
        status[r] = group.status();
        return;
      }
      comm::ProcessGroup& g = **group;
      Tensor in = Tensor::Full({elements / gs}, 1, DType::kFloat32);
      Tensor out = Tensor::Empty({elements}, DType::kFloat32);
      Tensor one = Tensor::Full({1}, 1, DType::kFloat32);
      Tensor big_in = Tensor::Full({big / gs}, 1, DType::kFloat32);
      Tensor big_out = Tensor::Empty({big}, DType::kFloat32);
      Tensor big_sum = Tensor::Full({big}, 1, DType::kFloat32);
      Tensor a = Tensor::Full({gemm_rows, gemm_width}, 0.5, DType::kFloat32);
      Tensor b = Tensor::Full({gemm_width, gemm_width}, 0.25, DType::kFloat32);
      Tensor c = Tensor::Empty({gemm_rows, gemm_width}, DType::kFloat32);
      auto note = [&](const absl::Status& s) {
        if (!s.ok() && status[r].ok()) status[r] = s;
        return s.ok();
      };
      // Seconds of `count` GEMMs (none when !gemms), each followed by
      // `collective` (if any), from a barrier.
      auto timed = [&](auto collective, bool gemms = true,
                       int count = kPerRound) -> double {
        if (!note(g.Barrier()->Wait())) return 0;
        const absl::Time t0 = absl::Now();
        for (int i = 0; i < count; ++i) {
          if (gemms && !note(ops::Gemm(a, false, b, false, &c))) return 0;
          if (!note(collective())) return 0;
        }
        return absl::ToDoubleSeconds(absl::Now() - t0);
      };
      for (int round = 0; round <= rounds; ++round) {
        if (!note(g.Barrier()->Wait())) return;
        const absl::Time s0 = absl::Now();
        for (int i = 0; i < kSmall; ++i) {
          if (!note(g.AllReduce(&one, comm::ReduceOp::kSum)->Wait())) return;
        }
        const double small = absl::ToDoubleSeconds(absl::Now() - s0);
        const double compute = timed([] { return absl::OkStatus(); });
        const double gather =
            timed([&] { return g.AllGather(in, &out)->Wait(); });
        const double big_gather =
            timed([&] { return g.AllGather(big_in, &big_out)->Wait(); }, false,
                  kBigPerRound);
        const double big_reduce = timed(
            [&] { return g.AllReduce(&big_sum, comm::ReduceOp::kSum)->Wait(); },
            false, kBigPerRound);
        if (r == 0 && round > 0) {  // Round 0 warms the connections up.
          small_s.push_back(small / kSmall);
          big_gather_s.push_back(big_gather / kBigPerRound);
          big_reduce_s.push_back(big_reduce / kBigPerRound);
          gather_s.push_back((gather - compute) / kPerRound);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) MCC_RETURN_IF_ERROR(s);
  // Back to back on idle ranks a collective costs its steps' latency plus
  // its bytes at the link's rate; between GEMMs it costs more, by about the
  // same time whatever its size (the ranks arrive apart, the collective
  // thread must be woken): that excess goes into every step's latency, so
  // a large all-reduce of gradients keeps the idle rate and the many small
  // TP collectives pay the excess each.
  const double n = gs, data = 4.0 * big;
  const double small_latency = Median(small_s) / (2 * (n - 1));
  auto rate = [&](double moved, double seconds, double steps) {
    const double transfer =
        std::max({1e-6, 0.1 * seconds, seconds - steps * small_latency});
    return moved / transfer;
  };
  CollectiveRates rates;
  rates.gather_bandwidth =
      rate((n - 1) / n * data, Median(big_gather_s), n - 1);
  rates.reduce_bandwidth =
      rate(2 * (n - 1) / n * data, Median(big_reduce_s), 2 * (n - 1));
  // A TP-sized gather between GEMMs is priced at the 16 MiB rate plus n - 1
  // steps' latency: the latency takes what its bytes at that rate leave of
  // the time the probe saw (at least a 4-byte all-reduce's step), so the
  // model gives that gather exactly its measured time.
  const double moved = (n - 1) / n * 4.0 * elements;
  rates.latency =
      std::max(small_latency,
               (Median(gather_s) - moved / rates.gather_bandwidth) / (n - 1));
  return rates;
}

}  // namespace

void SetGemmRates(double peak, double shaped, double shaped_small, double rows,
                  double small_rows, DeviceSpec* d) {
  // The 1024^3 reading is no ceiling for the model's shapes: a bf16 GEMM
  // picks its kernel per shape (core/ops/gemm.h), and on an AVX512-BF16 EPYC
  // the cube ran at 85-160 GFLOP/s where 512 x 1152 x 384 ran at 415-680; a
  // neighbour's load can also depress that one reading (a loaded probe read
  // 12.8 GFLOP/s for the fp32 cube). Capping the shaped GEMM's efficiency at
  // 1 then priced every GEMM at the cube's rate. The fastest rate seen
  // bounds the peak from below, so the efficiencies stay measured ratios and
  // the model's GEMMs run at the shaped GEMM's rate.
  peak = std::max({peak, shaped, shaped_small});
  d->fp32_flops = peak;
  d->bf16_flops = peak;
  d->gemm_efficiency = peak > 0 ? std::min(1.0, shaped / peak) : 1;
  if (peak > 0 && small_rows < rows) {
    d->gemm_rows = rows;
    d->gemm_small_rows = small_rows;
    d->gemm_small_efficiency = std::min(1.0, shaped_small / peak);
  }
}

double RankMemoryBandwidth(double node_bandwidth, int ranks, int cores) {
  return node_bandwidth / std::max(1, std::min(ranks, cores));
}

double ProbeClockSeconds(bool on_this_thread) {
  static const bool thread_cpu = [] {
    const char* v = std::getenv("MCC_PROBE_CLOCK");
    if (v == nullptr || std::string(v).empty() || std::string(v) == "wall") {
      return false;
    }
    LOG_IF(WARNING, std::string(v) != "thread_cpu")
        << "MCC_PROBE_CLOCK=" << v << " is neither wall nor thread_cpu: wall";
    return std::string(v) == "thread_cpu";
  }();
  if (!thread_cpu || !on_this_thread) {
    return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  }
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int ProbeThreadsPerRank(int cores, int ranks_per_node, int num_threads) {
  if (num_threads > 0) return num_threads;
  return std::max(1, cores / std::max(1, ranks_per_node));
}

DeviceSpec MeasureCpuDevice(const gpt::GPTConfig& model, DType dtype,
                            int ranks_per_node, int num_threads) {
  const double ranks = std::max(1, ranks_per_node);
  DeviceSpec d;
  d.name = "cpu";
  // Kernels run on the threads one rank gets (--num-threads, or train's
  // default: cores / local ranks), so a loaded machine's share shows as it
  // will in the run.
  const int saved_threads = ThreadPool::Global().num_threads();
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads_per_rank =
      ProbeThreadsPerRank(cores, static_cast<int>(ranks), num_threads);
  ThreadPool::SetGlobalThreads(threads_per_rank);
  const double peak = GemmRate(1024, 1024, 1024, dtype);
  // The shaped GEMMs and attention run on as many ranks at once as the cores
  // hold. With several threads a rank, only one: the kernels' pool runs one
  // loop at a time, so concurrent callers would queue, not contend.
  const int workers =
      threads_per_rank == 1 ? std::min(cores, static_cast<int>(ranks)) : 1;
  // Up to four sequences (micro-batch 4) through a hidden x hidden GEMM,
  // capped at 2048 rows and width.
  const int64_t rows = std::min<int64_t>(4 * model.seq_length, 2048);
  const int64_t width = std::min<int64_t>(model.hidden_size, 2048);
  // Both row counts are measured twice, a second apart, keeping the faster
  // median: a VM's neighbours can halve the rate for a second (seen: 0.50
  // of the peak in one probe, 0.93-0.97 in the next three).
  double shaped = ConcurrentGemmRate(workers, rows, width, width, dtype);
  // And a quarter of those rows (micro-batch 1; or CP), which run less
  // efficiently (measured: 35% slower GEMMs at 256 rows than at 1024; a
  // micro-batch of 1 sequence 7-20% slower than of 2 in training).
  const int64_t small_rows = std::max<int64_t>(16, rows / 4);
  double shaped_small =
      ConcurrentGemmRate(workers, small_rows, width, width, dtype);
  const double attention = AttentionRate(model, dtype, workers);
  // The model's own GEMM shapes against one square-ish GEMM of the same rows,
  // per TP degree the node can hold: narrower GEMMs (TP splits QKV, FC1 and
  // the output layer), transposed operands and the wide output layer run
  // slower than the shaped probe (measured, bench model at 1024 rows, two
  // ranks computing: one layer 0.92-0.97 of it, the output layer 0.79-0.91;
  // a step's mix 0.90-0.94 in fp32 and bf16, with each call's fixed cost
  // below in it; 0.89-0.98 without). Each list gets a second of calls: with
  // 0.4 s TP 1's layer measured 10% lower. Skipped for a model
  // whose GEMMs would take over 64 GFLOP a pass (their shapes are wide
  // enough to run at the shaped rate).
  std::map<int, double> mix_factor;
  double seconds_per_weight = 0;
  {
    const int64_t mix_rows = std::min<int64_t>(rows, 1024);
    const double square =
        ConcurrentGemmRate(workers, mix_rows, width, width, dtype);
    // A step's GEMMs at TP degree `tp` on `r` rows: every layer's and the
    // output layer's once; nothing when the model does not split over `tp`
    // or its GEMMs are too large to time.
    struct StepGemms {
      double flops = 0, seconds = 0, weights = 0;
    };
    auto time_step = [&](int tp, int64_t r, absl::Duration budget,
                         StepGemms* step) {
      const std::vector<GemmShape> layer = ModelGemms(model, tp, r, false);
      const std::vector<GemmShape> head = ModelGemms(model, tp, r, true);
      if (layer.empty() || Flops(layer) + Flops(head) > 64e9) return false;
      const double layer_rate = GemmListRate(workers, layer, dtype, budget);
      const double head_rate = GemmListRate(workers, head, dtype, budget);
      if (layer_rate <= 0 || head_rate <= 0) return false;
      const double layers = model.num_layers;
      step->flops = layers * Flops(layer) + Flops(head);
      step->seconds =
          layers * Flops(layer) / layer_rate + Flops(head) / head_rate;
      step->weights = layers * WeightElements(layer) + WeightElements(head);
      VLOG(1) << "planner probe: TP " << tp << " GEMMs " << r
              << " rows: one layer's " << layer_rate / 1e9
              << " GFLOP/s, the output layer's " << head_rate / 1e9
              << ", the shaped GEMM's " << square / 1e9;
      return true;
    };
    std::map<int, StepGemms> steps;
    for (int tp = 1; tp <= std::min(8, static_cast<int>(ranks)); tp *= 2) {
      StepGemms step;
      if (square > 0 &&
          time_step(tp, mix_rows, absl::Milliseconds(1000), &step)) {
        steps[tp] = step;
      }
    }
    // Each call also costs time for its weight-sized operand whatever the
    // rows (bench model, 2 ranks computing: a layer's GEMMs took 3.4, 7.7,
    // 24, 47, 92 and 184 ms at 16 to 2048 rows, about 1.8 ms plus 0.089 ms
    // a row), which a micro-batch of fewer rows pays for less work
    // (DP 2 training at micro-batch 1 against 2: 35 ms more in GEMMs a
    // step).
    // TP 1's step at a sixteenth of the rows gives that intercept: there it
    // is a third or more of the time, so the probe's noise moves it little.
    const int64_t few_rows = std::max<int64_t>(16, mix_rows / 16);
    auto tp1 = steps.find(1);
    StepGemms few;
    if (tp1 != steps.end() && few_rows < mix_rows &&
        time_step(1, few_rows, absl::Milliseconds(500), &few)) {
      const StepGemms& many = tp1->second;
      const double per_flop =
          (many.seconds - few.seconds) / (many.flops - few.flops);
      const double fixed = few.seconds - few.flops * per_flop;
      if (per_flop > 0 && fixed > 0) seconds_per_weight = fixed / few.weights;
    }
    for (const auto& [tp, step] : steps) {
      // The FLOPs' own rate: the step's time less its fixed cost.
      const double fixed =
          std::min(seconds_per_weight * step.weights, 0.5 * step.seconds);
      mix_factor[tp] =
          std::clamp(step.flops / (step.seconds - fixed) / square, 0.3, 1.5);
    }
  }
  std::vector<double> shaped_readings = {
      shaped, ConcurrentGemmRate(workers, rows, width, width, dtype)};
  shaped = std::max(shaped, shaped_readings.back());
  shaped_small =
      std::max(shaped_small,
               ConcurrentGemmRate(workers, small_rows, width, width, dtype));
  // The node's ranks' own collectives between GEMMs, at the size of one
  // sequence's hidden states (a TP all-gather's; 1-32 MiB).
  absl::StatusOr<CollectiveRates> collectives =
      absl::FailedPreconditionError("one rank a node");
  absl::StatusOr<CollectiveRates> subgroups =
      absl::FailedPreconditionError("no subgroup probe");
  if (ranks >= 2) {
    const int64_t bytes =
        std::clamp<int64_t>(model.seq_length * model.hidden_size * 4,
                            int64_t{1} << 20, int64_t{32} << 20);
    const int probe_ranks = std::min(static_cast<int>(ranks), 8);
    collectives = MeasureGlooCollectives(probe_ranks, probe_ranks, bytes, rows,
                                         width, 12);
    // When ranks time-share cores, a group smaller than the node (TP 2 of
    // 4 ranks, a pipeline's pair) pays more per collective than the whole
    // node does together: the node's other groups keep the cores busy when
    // its ring steps wake (measured, 4 ranks on 2 cores: 1.6-5.0 ms per
    // step of pairs against 0.8-1.3 ms of the four together).
    if (collectives.ok() && probe_ranks > 2 && ranks > cores) {
      subgroups =
          MeasureGlooCollectives(probe_ranks, 2, bytes, rows, width, 24);
    }
  }
  // A third reading after the collectives: a probe whose readings disagree
  // ran beside another load (DeviceSpec::probe_drift).
  shaped_readings.push_back(
      ConcurrentGemmRate(workers, rows, width, width, dtype));
  ThreadPool::SetGlobalThreads(saved_threads);
  // More ranks than cores time-share them (StepTime::core_wait).
  d.core_share = std::min(1.0, cores / ranks);
  SetGemmRates(peak, shaped, shaped_small, static_cast<double>(rows),
               static_cast<double>(small_rows), &d);
  // Gloo's transport needs the cores the kernels run on: no communication
  // is hidden behind computation (DeviceSpec::comm_overlap).
  d.comm_overlap = 0;
  // The same layout's prediction moved 3-13% between probes minutes apart
  // on a 2-core VM (docs/benchmarks/2026-12-03.md: PP 2 x DP 2 2.00 and 1.93 s,
  // DP 4 2.33 and 2.13 s, TP 4 + SP 3.81 and 3.33 s); the low end is the
  // band inside which the table's order is noise.
  d.prediction_spread = 0.05;
  const auto [slowest, fastest] =
      std::minmax_element(shaped_readings.begin(), shaped_readings.end());
  d.probe_drift = *fastest > 0 ? 1 - *slowest / *fastest : 0;
  d.gemm_mix_factor = std::move(mix_factor);
  d.gemm_seconds_per_weight = seconds_per_weight;
  d.attention_efficiency = shaped > 0 ? attention / shaped : 0.5;
  d.memory_bandwidth =
      RankMemoryBandwidth(CopyBandwidth(), ranks_per_node, cores);
  Loopback(&d.intra_node_bandwidth, &d.intra_node_latency);
  d.inter_node_bandwidth = d.intra_node_bandwidth;
  d.inter_node_latency = d.intra_node_latency;
  if (collectives.ok()) {
    d.intra_node_bandwidth = collectives->gather_bandwidth;
    d.reduce_bandwidth = collectives->reduce_bandwidth;
    d.intra_node_latency = collectives->latency;
    if (subgroups.ok()) {
      d.subgroup_bandwidth = subgroups->gather_bandwidth;
      d.subgroup_reduce_bandwidth = subgroups->reduce_bandwidth;
      d.subgroup_latency = subgroups->latency;
    }
  } else if (ranks >= 2) {
    LOG(WARNING) << "planner: gloo collectives probe failed ("
                 << collectives.status()
                 << "); using one loopback connection's rate";
  }
  d.link_efficiency = 1;
  d.allocator_overhead = 0;
  d.reduce_scatter_partial_blocks = 2;
  d.reduces_16bit_in_fp32 = true;
  d.elementwise_16bit_at_fp32_cost = true;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  d.memory_bytes = static_cast<double>(pages) * page / ranks;
  d.source = absl::StrCat("measured on this machine at start (--device cpu), ",
                          threads_per_rank, " kernel thread",
                          threads_per_rank == 1 ? "" : "s", " a rank");
  return d;
}

}  // namespace planner
}  // namespace mcc
