// A host-only stand-in for the few CUDA features that the kernels of the
// *_kernels.cuh files use, so that CI (no GPU) runs their indexing,
// masking, tiling and synchronisation against the CPU kernels: a block's
// threads run as cooperative fibers (ucontext), one block after another;
// __syncthreads, __syncwarp and warp shuffles are barriers at which a fiber
// yields, and the scheduler runs fibers round-robin until every live one waits,
// then releases the barrier. The schedule is deterministic; a missing
// __syncthreads shows up as a thread reading a tile that later threads have
// not written yet, or have already overwritten. A barrier that some threads
// never reach aborts the test with a message.
//
// Include this after every other header and before the kernels' .cuh: it
// defines the CUDA keywords (__global__, __device__, ...) and the names
// threadIdx, blockIdx, blockDim and gridDim as macros. Test-only.
#ifndef CORE_OPS_CUDA_CUDA_EMULATOR_H_
#define CORE_OPS_CUDA_CUDA_EMULATOR_H_

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

namespace mcc {
namespace cuda_emu {

struct Dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

class Emulator {
 public:
  // Runs kernel() for every thread of every block of grid x block, with
  // `shared_bytes` of dynamic shared memory per block (filled with NaN, so
  // reading what no thread wrote shows).
  static void Launch(Dim3 grid, unsigned int threads, size_t shared_bytes,
                     const std::function<void()>& kernel) {
    Emulator e(threads, shared_bytes, kernel);
    for (unsigned int z = 0; z < grid.z; ++z) {
      for (unsigned int y = 0; y < grid.y; ++y) {
        for (unsigned int x = 0; x < grid.x; ++x) {
          e.RunBlock(grid, Dim3{x, y, z});
        }
      }
    }
  }

  static Emulator& Current() { return *current_; }
  const Dim3& thread_idx() const { return fibers_[running_].idx; }
  const Dim3& block_idx() const { return block_; }
  const Dim3& block_dim() const { return block_dim_; }
  const Dim3& grid_dim() const { return grid_; }
  float* shared() { return shared_.data(); }

  void SyncThreads() { Yield(kBlockBarrier); }
  void SyncWarp() { Yield(kWarpBarrier); }

  // Words that thread `tid` publishes for the other lanes of its warp to
  // read between two warp barriers (emulated warp-wide instructions such as
  // mma_tile.cuh's products).
  static constexpr int kExchangeWords = 8;
  uint32_t* Exchange(unsigned int tid) {
    return &exchange_[tid * kExchangeWords];
  }

  float ShuffleXor(float v, int lane_mask) {
    const unsigned int t = running_;
    shuffle_[t] = v;
    Yield(kWarpBarrier);
    const float got = shuffle_[(t & ~31u) | ((t & 31u) ^ lane_mask)];
    Yield(kWarpBarrier);
    return got;
  }

 private:
  enum State { kRunnable, kBlockBarrier, kWarpBarrier, kDone };
  struct Fiber {
    ucontext_t context;
    std::vector<char> stack;
    Dim3 idx;
    State state = kRunnable;
  };
  static constexpr size_t kStackBytes = 256 * 1024;

  Emulator(unsigned int threads, size_t shared_bytes,
           const std::function<void()>& kernel)
      : fibers_(threads),
        shuffle_(threads),
        exchange_(threads * kExchangeWords),
        shared_((shared_bytes + sizeof(float) - 1) / sizeof(float)),
        kernel_(kernel) {
    if (threads == 0 || threads % 32 != 0) {
      std::fprintf(stderr, "emulator: %u threads per block, want 32 n\n",
                   threads);
      std::abort();
    }
    block_dim_ = Dim3{threads, 1, 1};
    for (Fiber& f : fibers_) f.stack.resize(kStackBytes);
  }

  static void Entry() {
    Emulator& e = Current();
    e.kernel_();
    e.fibers_[e.running_].state = kDone;
    // Returning resumes uc_link: the scheduler.
  }

  void Yield(State s) {
    fibers_[running_].state = s;
    swapcontext(&fibers_[running_].context, &scheduler_);
  }

  void RunBlock(Dim3 grid, Dim3 block) {
    grid_ = grid;
    block_ = block;
    current_ = this;
    std::fill(shared_.begin(), shared_.end(), std::nanf(""));
    const unsigned int n = static_cast<unsigned int>(fibers_.size());
    for (unsigned int t = 0; t < n; ++t) {
      Fiber& f = fibers_[t];
      f.idx = Dim3{t, 0, 0};
      f.state = kRunnable;
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = f.stack.data();
      f.context.uc_stack.ss_size = f.stack.size();
      f.context.uc_link = &scheduler_;
      makecontext(&f.context, &Emulator::Entry, 0);
    }
    for (;;) {
      bool ran = false;
      for (unsigned int t = 0; t < n; ++t) {
        if (fibers_[t].state != kRunnable) continue;
        running_ = t;
        swapcontext(&scheduler_, &fibers_[t].context);
        ran = true;
      }
      if (ran) continue;
      // Nothing runnable: release the warps whose 32 threads all wait at a
      // shuffle, else the block barrier if every thread waits there.
      bool released = false;
      for (unsigned int w = 0; w < n; w += 32) {
        bool all = true;
        for (unsigned int t = w; t < w + 32; ++t)
          all = all && fibers_[t].state == kWarpBarrier;
        if (!all) continue;
        for (unsigned int t = w; t < w + 32; ++t) fibers_[t].state = kRunnable;
        released = true;
      }
      if (released) continue;
      unsigned int at_barrier = 0, done = 0;
      for (const Fiber& f : fibers_) {
        at_barrier += f.state == kBlockBarrier;
        done += f.state == kDone;
      }
      if (done == n) break;
      if (at_barrier == n) {
        for (Fiber& f : fibers_) f.state = kRunnable;
        continue;
      }
      std::fprintf(stderr,
                   "emulator: block (%u, %u, %u) deadlocks: %u of %u threads "
                   "at __syncthreads, %u done, the rest at a shuffle\n",
                   block.x, block.y, block.z, at_barrier, n, done);
      std::abort();
    }
  }

  static inline Emulator* current_ = nullptr;
  std::vector<Fiber> fibers_;
  std::vector<float> shuffle_;
  std::vector<uint32_t> exchange_;
  std::vector<float> shared_;
  const std::function<void()>& kernel_;
  ucontext_t scheduler_;
  unsigned int running_ = 0;
  Dim3 grid_, block_, block_dim_;
};

}  // namespace cuda_emu
}  // namespace mcc

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define MCC_FA_UNROLL
#define threadIdx (::mcc::cuda_emu::Emulator::Current().thread_idx())
#define blockIdx (::mcc::cuda_emu::Emulator::Current().block_idx())
#define blockDim (::mcc::cuda_emu::Emulator::Current().block_dim())
#define gridDim (::mcc::cuda_emu::Emulator::Current().grid_dim())
#define __syncthreads() (::mcc::cuda_emu::Emulator::Current().SyncThreads())

inline void __syncwarp(unsigned int /*mask*/ = 0xffffffffu) {
  ::mcc::cuda_emu::Emulator::Current().SyncWarp();
}

inline float __shfl_xor_sync(unsigned int /*mask*/, float v, int lane_mask) {
  return ::mcc::cuda_emu::Emulator::Current().ShuffleXor(v, lane_mask);
}

#endif  // CORE_OPS_CUDA_CUDA_EMULATOR_H_
