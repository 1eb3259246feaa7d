// Collective bandwidth of the gloo backend on this machine, as nccl-tests
// reports it: algbw = bytes / time, busbw = algbw * 2(n-1)/n for all-reduce
// and algbw * (n-1)/n for all-gather and reduce-scatter (bytes: the full
// buffer, i.e. the all-gather output and the reduce-scatter input). Runs 2
// and 4 processes of itself on loopback, plus memcpy bandwidth.
//
//   tools/bazel run //core/comm:bench -- [--format=json] [--max_bytes=N]
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/port_reservation.h"
#include "core/comm/process_group.h"
#include "core/tensor.h"

ABSL_FLAG(std::string, format, "text", "text or json (one object per line)");
ABSL_FLAG(int64_t, min_bytes, 1 << 10, "Smallest message.");
ABSL_FLAG(int64_t, max_bytes, 256ll << 20, "Largest message.");
ABSL_FLAG(std::string, world_sizes, "2,4", "Process counts to run.");

namespace {

using Clock = std::chrono::steady_clock;

void Emit(bool json, const std::string& name, const std::string& shape,
          double value, const std::string& unit) {
  if (json) {
    printf(
        "{\"name\": \"%s\", \"dtype\": \"fp32\", \"shape\": \"%s\", "
        "\"value\": %.4f, \"unit\": \"%s\"}\n",
        name.c_str(), shape.c_str(), value, unit.c_str());
  } else {
    printf("%-40s %-14s %12.4f %s\n", name.c_str(), shape.c_str(), value,
           unit.c_str());
  }
  fflush(stdout);
}

int Iterations(int64_t bytes) {
  return static_cast<int>(
      std::max<int64_t>(2, std::min<int64_t>(50, (256ll << 20) / bytes / 4)));
}

int Worker(bool json) {
  mcc::comm::GroupOptions options;
  options.timeout = absl::Minutes(2);
  options.debug_collectives = false;
  auto world = mcc::comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 1;
  }
  mcc::comm::ProcessGroup& pg = *world->group;
  const int n = pg.size();
  for (int64_t bytes = absl::GetFlag(FLAGS_min_bytes);
       bytes <= absl::GetFlag(FLAGS_max_bytes); bytes *= 4) {
    const int64_t elems = bytes / 4;
    for (const char* op : {"all_reduce", "all_gather", "reduce_scatter"}) {
      mcc::Tensor full = mcc::Tensor::Full({elems}, 1.0, mcc::DType::kFloat32);
      mcc::Tensor part =
          mcc::Tensor::Full({elems / n}, 1.0, mcc::DType::kFloat32);
      mcc::Tensor full_n = full.Slice(0, (elems / n) * n).value();
      auto run = [&]() -> absl::Status {
        if (op[4] == 'r')
          return pg.AllReduceSync(&full, mcc::comm::ReduceOp::kSum);
        if (op[4] == 'g') return pg.AllGatherSync(part, &full_n);
        return pg.ReduceScatterSync(full_n, &part, mcc::comm::ReduceOp::kSum);
      };
      absl::Status s = run();  // Warm-up.
      if (s.ok()) s = pg.BarrierSync();
      const int iters = Iterations(bytes);
      const auto start = Clock::now();
      for (int i = 0; i < iters && s.ok(); ++i) s = run();
      const double secs =
          std::chrono::duration<double>(Clock::now() - start).count() / iters;
      if (!s.ok()) {
        fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
      // Rank 0's time, as nccl-tests reports.
      if (pg.rank() == 0) {
        const double algbw = static_cast<double>(bytes) / secs / 1e9;
        const double factor =
            op[4] == 'r' ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
        const std::string base = absl::StrCat("comm/gloo/", op, "/np", n);
        const std::string shape = absl::StrCat("[", elems, "]");
        Emit(json, base + "/time", shape, secs * 1e6, "us");
        Emit(json, base + "/algbw", shape, algbw, "GB/s");
        Emit(json, base + "/busbw", shape, algbw * factor, "GB/s");
      }
      s = pg.BarrierSync();
      if (!s.ok()) return 1;
    }
  }
  return 0;
}

void Memcpy(bool json) {
  const size_t bytes = 256ull << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::memcpy(b.data(), a.data(), bytes);  // Fault pages in.
  const int iters = 5;
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(),
                bytes);
  }
  const double secs =
      std::chrono::duration<double>(Clock::now() - start).count() / iters;
  Emit(json, "comm/memcpy/bandwidth", absl::StrCat("[", bytes, "] bytes"),
       bytes / secs / 1e9, "GB/s");
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const bool json = absl::GetFlag(FLAGS_format) == "json";
  if (std::getenv("MCC_BENCH_WORKER") != nullptr) return Worker(json);
  Memcpy(json);
  for (char c : absl::GetFlag(FLAGS_world_sizes)) {
    if (c < '1' || c > '9') continue;
    const int n = c - '0';
    // Held until rank 0 serves the store on it (see PortReservation).
    mcc::comm::PortReservation reservation =
        mcc::comm::PortReservation::Listen("127.0.0.1", 0).value();
    const int port = reservation.port();
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
      pid_t pid = fork();
      if (pid == 0) {
        setenv("MCC_BENCH_WORKER", "1", 1);
        setenv("RANK", std::to_string(r).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
        setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        if (r == 0) reservation.HandToChild();
        std::vector<char*> args(argv, argv + argc);
        args.push_back(nullptr);
        execv("/proc/self/exe", args.data());
        _exit(127);
      }
      pids.push_back(pid);
    }
    reservation.Release();
    int failed = 0;
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
    }
    if (failed) {
      fprintf(stderr, "bench with %d processes failed\n", n);
      return 1;
    }
  }
  return 0;
}
