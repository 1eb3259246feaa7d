// The sliding-window rule of the paged decoding kernels, in one place for
// the CPU kernel (paged_attention.cc), the CUDA kernel
// (cuda/paged_attention_kernels.cuh, which the host emulator also compiles)
// and the serving engine that feeds them: a query at `position` reads the
// keys SlidingWindowFirstKey(position, window_left) .. position.
// window_left is Mistral's sliding_window - 1; negative means no window.
// Plain C++ with no includes beyond <cstdint>, so nvcc and the host
// compiler both take it.
#ifndef CORE_OPS_SLIDING_WINDOW_H_
#define CORE_OPS_SLIDING_WINDOW_H_

#include <cstdint>

#ifdef __CUDACC__
#define MCC_SLIDING_WINDOW_HOST_DEVICE __host__ __device__
#else
#define MCC_SLIDING_WINDOW_HOST_DEVICE
#endif

namespace mcc {
namespace ops {

// The first position a query at `position` reads: max(0, position -
// window_left) with a window, else 0.
MCC_SLIDING_WINDOW_HOST_DEVICE inline int64_t SlidingWindowFirstKey(
    int64_t position, int64_t window_left) {
  return window_left >= 0 && position - window_left > 0 ? position - window_left
                                                        : 0;
}

}  // namespace ops
}  // namespace mcc

#undef MCC_SLIDING_WINDOW_HOST_DEVICE

#endif  // CORE_OPS_SLIDING_WINDOW_H_
