// ops::CachedAttention on CUDA tensors (cached_attention.cu, registered by
// registrations.cc) against the CPU kernel on the same random inputs,
// within flash_attention_test_util.h's CachedBound: decode and prefill
// chunks, GQA, odd positions, head dims 64 to 256, every q dtype. Skips
// without a CUDA device (the *_on_test_device build runs every line in CI).
#include "core/ops/cached_attention.h"

#include <cstdint>

#include "core/ops/cuda/flash_attention_test_util.h"
#include "core/ops/cuda/test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using flash_testing::CachedCase;
using testing::CudaTest;
using testing::KernelDevice;
using testing::SameBytes;
using testing::ToCuda;
using testing::ToHost;

class CudaCachedAttentionTest : public CudaTest {};

TEST(CudaCachedAttentionSlotTest, HoldsACudaKernel) {
  EXPECT_TRUE(CachedAttentionKernels().Get(Device::CUDA(0)).ok());
}

TEST_F(CudaCachedAttentionTest, MatchesTheCpuKernel) {
  uint32_t seed = 5;
  for (const CachedCase& c : flash_testing::CachedCases()) {
    SCOPED_TRACE(c.Name());
    const Tensor q =
        flash_testing::RandomTensor({c.b, c.n, c.heads, c.d}, c.dtype, seed++);
    const Tensor k = flash_testing::RandomTensor(
        {c.b, c.capacity, c.groups, c.d}, DType::kFloat32, seed++);
    const Tensor v = flash_testing::RandomTensor(
        {c.b, c.capacity, c.groups, c.d}, DType::kFloat32, seed++);
    Tensor want = Tensor::Empty(q.shape(), c.dtype);
    ASSERT_TRUE(CachedAttention(q, k, v, c.position, &want).ok());
    const Tensor qd = ToCuda(q), kd = ToCuda(k), vd = ToCuda(v);
    Tensor got = Tensor::Empty(q.shape(), c.dtype, KernelDevice());
    const absl::Status st = CachedAttention(qd, kd, vd, c.position, &got);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(flash_testing::Near("out", ToHost(got), want,
                                    flash_testing::CachedBound(c, q, k, v)));
    Tensor again = Tensor::Empty(q.shape(), c.dtype, KernelDevice());
    ASSERT_TRUE(CachedAttention(qd, kd, vd, c.position, &again).ok());
    EXPECT_TRUE(SameBytes(again, got));
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
