#include "core/ops/cuda/dropout.h"
#include "core/ops/cuda/kernel_util.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;
using internal::kThreads;
using internal::LoadAs;
using internal::StoreAs;

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

// Philox4x32-10 block j of the stream (core/ops/dropout.cc's
// Philox4x32_10 with counter {lo32(j), hi32(j), 0, 0}).
__host__ __device__ __forceinline__ uint4 PhiloxBlock(uint64_t j, uint32_t k0,
                                                      uint32_t k1) {
  uint32_t c0 = static_cast<uint32_t>(j), c1 = static_cast<uint32_t>(j >> 32);
  uint32_t c2 = 0, c3 = 0;
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32);
    const uint32_t lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32);
    const uint32_t lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return make_uint4(c0, c1, c2, c3);
}

// One thread per Philox block: the up to four elements whose stream words
// it holds.
__global__ void DropoutKernel(const void* x, ElemType xt, void* y, ElemType yt,
                              int64_t n, uint64_t seed, uint64_t offset,
                              uint32_t threshold, float scale) {
  const uint64_t first_block = offset / 4;
  const uint64_t last_block = (offset + n - 1) / 4;
  const uint32_t k0 = static_cast<uint32_t>(seed);
  const uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  for (uint64_t j = first_block + GlobalThread(); j <= last_block;
       j += GridStride()) {
    const uint4 b = PhiloxBlock(j, k0, k1);
    const uint32_t words[4] = {b.x, b.y, b.z, b.w};
    for (int r = 0; r < 4; ++r) {
      const uint64_t w = 4 * j + r;
      if (w < offset || w >= offset + n) continue;
      const int64_t e = static_cast<int64_t>(w - offset);
      const float keep = (words[r] >> 8) >= threshold ? scale : 0.0f;
      StoreAs(y, yt, e, LoadAs(x, xt, e) * keep);
    }
  }
}

__global__ void CopyKernel(const void* x, ElemType xt, void* y, ElemType yt,
                           int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    StoreAs(y, yt, i, LoadAs(x, xt, i));
  }
}

}  // namespace

void PhiloxBlockForTesting(uint64_t j, uint64_t seed, uint32_t out[4]) {
  const uint4 b = PhiloxBlock(j, static_cast<uint32_t>(seed),
                              static_cast<uint32_t>(seed >> 32));
  out[0] = b.x;
  out[1] = b.y;
  out[2] = b.z;
  out[3] = b.w;
}

cudaError_t Dropout(const void* x, ElemType xt, void* y, ElemType yt, int64_t n,
                    uint64_t seed, uint64_t offset, uint32_t threshold,
                    float scale, bool identity, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (identity) {
    if (x == y) return cudaSuccess;
    CopyKernel<<<GridFor(n), kThreads, 0, stream>>>(x, xt, y, yt, n);
  } else {
    const int64_t blocks =
        static_cast<int64_t>((offset + n - 1) / 4 - offset / 4 + 1);
    DropoutKernel<<<GridFor(blocks), kThreads, 0, stream>>>(
        x, xt, y, yt, n, seed, offset, threshold, scale);
  }
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
