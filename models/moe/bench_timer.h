#ifndef MODELS_MOE_BENCH_TIMER_H_
#define MODELS_MOE_BENCH_TIMER_H_

// Wall time and process CPU time of a call, for the MoE benchmarks. On a
// machine shared with other jobs wall time measures the scheduler as much as
// the code; the process's CPU time (user + system, every thread) does not,
// as long as the process computes on one thread (spinning OpenMP or pool
// threads would count as CPU time too).

#include <time.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace mcc {
namespace moe {

struct BenchTime {
  double wall = 0;  // Seconds.
  double cpu = 0;   // Seconds of this process's CPU time.

  BenchTime& operator+=(const BenchTime& o) {
    wall += o.wall;
    cpu += o.cpu;
    return *this;
  }
};

inline double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Starts at construction; Elapsed() is the time since.
class BenchStopwatch {
 public:
  BenchStopwatch()
      : wall0_(std::chrono::steady_clock::now()), cpu0_(ProcessCpuSeconds()) {}
  BenchTime Elapsed() const {
    BenchTime t;
    t.wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0_)
            .count();
    t.cpu = ProcessCpuSeconds() - cpu0_;
    return t;
  }

 private:
  std::chrono::steady_clock::time_point wall0_;
  double cpu0_;
};

template <typename Fn>
BenchTime TimeCall(Fn&& fn) {
  BenchStopwatch watch;
  fn();
  return watch.Elapsed();
}

// Medians of the wall and CPU times, each taken separately.
inline BenchTime Median(std::vector<BenchTime> times) {
  if (times.empty()) return {};
  std::vector<double> wall, cpu;
  for (const BenchTime& t : times) {
    wall.push_back(t.wall);
    cpu.push_back(t.cpu);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

}  // namespace moe
}  // namespace mcc

#endif  // MODELS_MOE_BENCH_TIMER_H_
