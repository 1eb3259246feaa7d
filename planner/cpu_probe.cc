#include "planner/cpu_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/ops/attention.h"
#include "core/ops/gemm.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace mcc {
namespace planner {
namespace {

// Best rate of `flops`-sized calls of `run` over about `budget`.
template <typename Fn>
double BestRate(double work, absl::Duration budget, Fn run) {
  double best = 0;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 1000; ++i) {
    const absl::Time t0 = absl::Now();
    if (!run()) return 0;
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    if (i > 0 && s > 0) best = std::max(best, work / s);  // first: warm-up
    if (i >= 3 && absl::Now() - start > budget) break;
  }
  return best;
}

double GemmRate(int64_t m, int64_t k, int64_t n, DType dtype) {
  const DType in =
      dtype == DType::kFloat32 ? DType::kFloat32 : DType::kBFloat16;
  Tensor a = Tensor::Full({m, k}, 0.5, in);
  Tensor b = Tensor::Full({k, n}, 0.25, in);
  Tensor c = Tensor::Empty({m, n}, DType::kFloat32);
  return BestRate(2.0 * m * k * n, absl::Milliseconds(400),
                  [&] { return ops::Gemm(a, false, b, false, &c).ok(); });
}

double AttentionRate(const gpt::GPTConfig& model, DType dtype) {
  // Capped, so a large model's probe stays well under a second a call.
  const int64_t s = std::min<int64_t>(model.seq_length, 1024);
  const int64_t heads = std::min(model.num_attention_heads, 8);
  const int64_t d = model.head_dim();
  const DType t = dtype == DType::kFloat32 ? DType::kFloat32 : dtype;
  Tensor q = Tensor::Full({1, s, heads, d}, 0.1, t);
  Tensor out = Tensor::Empty(q.shape(), t);
  Tensor lse = Tensor::Empty({1, heads, s}, DType::kFloat32);
  ops::AttentionOptions options;
  options.causal = true;
  const double flops = 0.5 * 4.0 * s * s * heads * d;
  return BestRate(flops, absl::Milliseconds(300), [&] {
    return ops::FlashAttentionForward(q, q, q, options, &out, &lse).ok();
  });
}

// Bytes read plus written per second, copying 64 MiB per core at once.
double CopyBandwidth() {
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  const size_t bytes = size_t{64} << 20;
  std::vector<std::vector<char>> src(threads, std::vector<char>(bytes, 1));
  std::vector<std::vector<char>> dst(threads, std::vector<char>(bytes, 0));
  return BestRate(2.0 * bytes * threads, absl::Milliseconds(300), [&] {
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back(
          [&, i] { std::memcpy(dst[i].data(), src[i].data(), bytes); });
    }
    for (std::thread& t : pool) t.join();
    return true;
  });
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

}  // namespace

DeviceSpec MeasureCpuDevice(const gpt::GPTConfig& model, DType dtype,
                            int ranks_per_node) {
  const double ranks = std::max(1, ranks_per_node);
  DeviceSpec d;
  d.name = "cpu";
  // Kernels run on the threads one rank gets (train's default: cores /
  // local ranks), so a loaded machine's share shows as it will in the run.
  const int saved_threads = ThreadPool::Global().num_threads();
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  ThreadPool::SetGlobalThreads(std::max(1, cores / static_cast<int>(ranks)));
  const double peak = GemmRate(1024, 1024, 1024, dtype);
  // One sequence through a hidden x hidden GEMM, capped at 2048^3.
  const int64_t rows = std::min<int64_t>(model.seq_length, 2048);
  const int64_t width = std::min<int64_t>(model.hidden_size, 2048);
  const double shaped = GemmRate(rows, width, width, dtype);
  // And a quarter of those rows (micro-batch 1 under CP, say), which run
  // less efficiently (measured: 35% slower GEMMs at 256 rows than at 1024).
  const int64_t small_rows = std::max<int64_t>(16, rows / 4);
  const double shaped_small = GemmRate(small_rows, width, width, dtype);
  const double attention = AttentionRate(model, dtype);
  ThreadPool::SetGlobalThreads(saved_threads);
  // More ranks than cores time-share them (StepTime::core_wait).
  d.core_share = std::min(1.0, cores / ranks);
  d.fp32_flops = peak;
  d.bf16_flops = peak;
  d.gemm_efficiency = peak > 0 ? std::min(1.0, shaped / peak) : 1;
  if (peak > 0 && small_rows < rows) {
    d.gemm_rows = static_cast<double>(rows);
    d.gemm_small_rows = static_cast<double>(small_rows);
    d.gemm_small_efficiency = std::min(1.0, shaped_small / peak);
  }
  // Gloo's transport needs the cores the kernels run on: no communication
  // is hidden behind computation (DeviceSpec::comm_overlap).
  d.comm_overlap = 0;
  d.attention_efficiency = shaped > 0 ? attention / shaped : 0.5;
  d.memory_bandwidth = CopyBandwidth() / ranks;
  Loopback(&d.intra_node_bandwidth, &d.intra_node_latency);
  d.inter_node_bandwidth = d.intra_node_bandwidth;
  d.inter_node_latency = d.intra_node_latency;
  d.link_efficiency = 1;
  d.allocator_overhead = 0;
  d.reduce_scatter_copies_input = true;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  d.memory_bytes = static_cast<double>(pages) * page / ranks;
  d.source = "measured on this machine at start (--device cpu)";
  return d;
}

}  // namespace planner
}  // namespace mcc
