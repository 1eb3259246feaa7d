// The cached-attention CUDA kernel (cached_attention_kernels.cuh), run on
// the host through cuda_emulator.h, against the CPU kernel
// (core/ops/cached_attention.cc) within flash_attention_test_util.h's
// CachedBound. Needs no GPU.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/ops/cached_attention.h"
#include "core/ops/cuda/elem_type.h"
#include "core/ops/cuda/flash_attention_test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

// After every other header: it defines CUDA's keywords as macros.
#include "core/ops/cuda/emulated_device.h"
// The kernels, after the definitions they expect.
#include "core/ops/cuda/cached_attention_kernels.cuh"

namespace mcc {
namespace ops {
namespace {

namespace cached = ::mcc::cuda_kernels::cached;
using cuda_emu::Dim3;
using cuda_emu::Emulator;
using cuda_kernels::ElemType;
using flash_testing::CachedCase;

ElemType TypeOf(DType t) {
  return t == DType::kBFloat16  ? ElemType::kBF16
         : t == DType::kFloat16 ? ElemType::kF16
                                : ElemType::kF32;
}

TEST(CachedAttentionEmulatedTest, MatchesTheCpuKernel) {
  uint32_t seed = 3;
  for (const CachedCase& c : flash_testing::CachedCases()) {
    SCOPED_TRACE(c.Name());
    const Tensor q =
        flash_testing::RandomTensor({c.b, c.n, c.heads, c.d}, c.dtype, seed++);
    const Tensor k = flash_testing::RandomTensor(
        {c.b, c.capacity, c.groups, c.d}, DType::kFloat32, seed++);
    const Tensor v = flash_testing::RandomTensor(
        {c.b, c.capacity, c.groups, c.d}, DType::kFloat32, seed++);
    Tensor want = Tensor::Empty(q.shape(), c.dtype);
    Tensor got = Tensor::Empty(q.shape(), c.dtype);
    ASSERT_TRUE(CachedAttention(q, k, v, c.position, &want).ok());
    cached::Params p;
    p.q = q.raw_data();
    p.qt = TypeOf(c.dtype);
    p.k = k.data<float>();
    p.v = v.data<float>();
    p.out = got.raw_data();
    p.b = c.b;
    p.n = c.n;
    p.heads = c.heads;
    p.groups = c.groups;
    p.capacity = c.capacity;
    p.d = c.d;
    p.position = c.position;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    Emulator::Launch(Dim3{static_cast<unsigned int>(c.b * c.n * c.heads), 1, 1},
                     cached::kThreads, cached::kSmemBytes,
                     [&] { cached::CachedAttentionKernel(p); });
    EXPECT_TRUE(flash_testing::Near("out", got, want,
                                    flash_testing::CachedBound(c, q, k, v)));
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
