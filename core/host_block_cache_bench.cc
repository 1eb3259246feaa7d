// Times taking, touching and freeing a large host buffer the way a training
// step does with its activations: through glibc (aligned_alloc/free, the
// CPU allocator's old path) and through HostBlockCache (its path now), in
// the same run.
//
//   tools/bazel run //core:host_block_cache_bench [-- --mib 32 --rounds 10]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "core/host_block_cache.h"

ABSL_FLAG(int, mib, 32, "Buffer size in MiB.");
ABSL_FLAG(int, rounds, 10, "Take-touch-free rounds per path.");

namespace {

double MillisecondsPerRound(int rounds, void* (*take)(size_t),
                            void (*give)(void*), size_t bytes) {
  double total = 0;
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    char* p = static_cast<char*>(take(bytes));
    if (p == nullptr) {
      std::fprintf(stderr, "allocation of %zu bytes failed\n", bytes);
      std::exit(1);
    }
    std::memset(p, i, bytes);  // A kernel writing its output.
    give(p);
    total += std::chrono::duration<double, std::milli>(
                 std::chrono::steady_clock::now() - t0)
                 .count();
  }
  return total / rounds;
}

mcc::HostBlockCache* cache = nullptr;

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_mib)) << 20;
  const int rounds = absl::GetFlag(FLAGS_rounds);
  mcc::HostBlockCache block_cache(bytes * 2);
  cache = &block_cache;
  const double glibc = MillisecondsPerRound(
      rounds, [](size_t n) { return std::aligned_alloc(64, n); }, &std::free,
      bytes);
  const double cached = MillisecondsPerRound(
      rounds, [](size_t n) { return cache->Allocate(n); },
      [](void* p) { cache->Free(p); }, bytes);
  // The memset alone, on memory already touched: the floor.
  char* warm = static_cast<char*>(block_cache.Allocate(bytes));
  std::memset(warm, 1, bytes);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) std::memset(warm, i, bytes);
  const double write_only = std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - t0)
                                .count() /
                            rounds;
  block_cache.Free(warm);
  std::printf(
      "%d MiB buffer, take + write + free, ms per round (%d rounds):\n"
      "  glibc aligned_alloc/free: %8.2f\n"
      "  HostBlockCache:           %8.2f  (%.1fx faster)\n"
      "  write alone (reference):  %8.2f\n",
      absl::GetFlag(FLAGS_mib), rounds, glibc, cached, glibc / cached,
      write_only);
  return 0;
}
