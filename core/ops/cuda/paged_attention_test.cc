// The paged decoding ops on CUDA tensors (paged_attention.cu, registered by
// registrations.cc) against the CPU kernels on the same random inputs:
// PagedKvWrite bit for bit, PagedAttention (shuffled block tables, a
// partial last block, GQA, head dims 64 to 128, with and without a sliding
// window, the blocks before a window poisoned with NaN) and
// RotaryAtPositions (fp32 and bf16 output, a partial rotary_dim) within
// stated bounds. Skips without a CUDA device (the *_on_test_device build
// runs every line in CI).
#include "core/ops/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/ops/cuda/test_util.h"
#include "core/ops/rotary.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using testing::CudaTest;
using testing::KernelDevice;
using testing::OutputUlp;
using testing::RandomHost;
using testing::SameBytes;
using testing::ToCuda;
using testing::ToHost;
using testing::Values;
using testing::WithinBound;

class CudaPagedAttentionTest : public CudaTest {};

TEST(CudaPagedAttentionSlotTest, HoldsCudaKernels) {
  EXPECT_TRUE(PagedKvWriteKernels().Get(Device::CUDA(0)).ok());
  EXPECT_TRUE(PagedAttentionKernels().Get(Device::CUDA(0)).ok());
  EXPECT_TRUE(RotaryAtPositionsKernels().Get(Device::CUDA(0)).ok());
}

TEST_F(CudaPagedAttentionTest, KvWriteGivesTheCpuKernelsBits) {
  const int64_t rows = 7, groups = 2, d = 64, blocks = 5, bs = 4;
  const Tensor k = RandomHost({rows, groups, d}, DType::kFloat32, 1);
  const Tensor v = RandomHost({rows, groups, d}, DType::kFloat32, 2);
  // Distinct slots in shuffled blocks, one block left alone.
  const Tensor slots =
      *Tensor::FromInts({9, 0, 17, 3, 4, 19, 12}, {rows}, DType::kInt64);
  Tensor want_k = RandomHost({blocks, bs, groups, d}, DType::kFloat32, 3);
  Tensor want_v = RandomHost(want_k.shape(), DType::kFloat32, 4);
  Tensor got_k = ToCuda(want_k), got_v = ToCuda(want_v);
  ASSERT_TRUE(PagedKvWrite(k, v, slots, &want_k, &want_v).ok());
  const absl::Status st =
      PagedKvWrite(ToCuda(k), ToCuda(v), ToCuda(slots), &got_k, &got_v);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(SameBytes(got_k, want_k));
  EXPECT_TRUE(SameBytes(got_v, want_v));
}

TEST_F(CudaPagedAttentionTest, AttentionMatchesTheCpuKernel) {
  struct Case {
    int64_t heads, groups, d, block_size, window_left;
  };
  for (const Case& c :
       {Case{8, 2, 64, 16, -1}, Case{4, 4, 128, 4, -1}, Case{8, 1, 80, 3, -1},
        Case{8, 2, 64, 4, 6}, Case{4, 1, 128, 16, 20}, Case{8, 2, 64, 3, 0}}) {
    SCOPED_TRACE(::testing::Message()
                 << "heads " << c.heads << " groups " << c.groups << " d "
                 << c.d << " block " << c.block_size << " window "
                 << c.window_left);
    // Rows at positions across several blocks, more keys than the
    // kernel's warps, a partial last block. The last pool block holds
    // NaNs: table entries of blocks wholly before a row's window point
    // there, so reading one spoils the row.
    const std::vector<int64_t> pos = {0, 13, 5, 40, 77, 31};
    const int64_t rows = static_cast<int64_t>(pos.size());
    const int64_t max_blocks = 78 / c.block_size + 1;
    const int64_t blocks = max_blocks + 3;
    std::vector<int64_t> order(blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(c.d + c.heads));
    std::vector<int64_t> t(rows * max_blocks);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < max_blocks; ++b) {
        t[r * max_blocks + b] = order[(r * 3 + b) % blocks];
      }
      const int64_t first =
          c.window_left >= 0 ? std::max<int64_t>(0, pos[r] - c.window_left) : 0;
      for (int64_t b = 0; b < first / c.block_size; ++b) {
        t[r * max_blocks + b] = blocks;
      }
    }
    const Tensor tables =
        *Tensor::FromInts(t, {rows, max_blocks}, DType::kInt32);
    const Tensor positions = *Tensor::FromInts(pos, {rows});
    const Tensor q =
        RandomHost({rows, c.heads, c.d}, DType::kFloat32, 5, -1, 1);
    Tensor k = RandomHost({blocks + 1, c.block_size, c.groups, c.d},
                          DType::kFloat32, 6, -1, 1);
    Tensor v = RandomHost(k.shape(), DType::kFloat32, 7, -1, 1);
    const int64_t block_elems = c.block_size * c.groups * c.d;
    for (Tensor* pool : {&k, &v}) {
      std::fill_n(pool->data<float>() + blocks * block_elems, block_elems,
                  std::numeric_limits<float>::quiet_NaN());
    }
    Tensor want = Tensor::Empty(q.shape(), DType::kFloat32);
    ASSERT_TRUE(
        PagedAttention(q, k, v, tables, positions, &want, c.window_left).ok());
    const Tensor qd = ToCuda(q), kd = ToCuda(k), vd = ToCuda(v);
    const Tensor td = ToCuda(tables), pd = ToCuda(positions);
    Tensor got = Tensor::Empty(q.shape(), DType::kFloat32, KernelDevice());
    const absl::Status st =
        PagedAttention(qd, kd, vd, td, pd, &got, c.window_left);
    ASSERT_TRUE(st.ok()) << st;
    // Softmax weights summing to one over values in [-1, 1], exp and the
    // sums in another order: a few fp32 ulps of 1 apart.
    const std::vector<double> bound(want.numel(), 1e-5);
    EXPECT_TRUE(WithinBound(Values(got), Values(want), bound));
    // A row's result depends on nothing but its own inputs: the same bits
    // again.
    Tensor again = Tensor::Empty(q.shape(), DType::kFloat32, KernelDevice());
    ASSERT_TRUE(PagedAttention(qd, kd, vd, td, pd, &again, c.window_left).ok());
    EXPECT_TRUE(SameBytes(again, got));
  }
}

TEST_F(CudaPagedAttentionTest, RotaryAtPositionsMatchesTheCpuKernel) {
  const int64_t rows = 5, heads = 4, d = 64;
  const Tensor positions =
      *Tensor::FromInts({0, 17, 4000, 3, 131071}, {rows}, DType::kInt64);
  for (int64_t rotary_dim : {int64_t{0}, int64_t{32}}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(::testing::Message()
                   << "rotary_dim " << rotary_dim << " " << DTypeName(dtype));
      RotaryOptions options;
      options.rotary_dim = rotary_dim;
      options.base = 500000;
      const Tensor x = RandomHost({rows, heads, d}, dtype, 8);
      Tensor want = Tensor::Empty(x.shape(), dtype);
      ASSERT_TRUE(RotaryAtPositions(x, positions, options, &want).ok());
      const Tensor xd = ToCuda(x);
      Tensor got = Tensor::Empty(x.shape(), dtype, KernelDevice());
      const absl::Status st =
          RotaryAtPositions(xd, ToCuda(positions), options, &got);
      ASSERT_TRUE(st.ok()) << st;
      // The same float64 angles; fp32 products (the GPU may fuse them)
      // of values within 2: a few fp32 ulps, and in bf16 at most one
      // rounding step more.
      const std::vector<double> w = Values(want);
      std::vector<double> bound(w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        bound[i] = 2e-6 + OutputUlp(dtype) * std::fabs(w[i]);
      }
      EXPECT_TRUE(WithinBound(Values(got), w, bound));
      // In place, as the engine calls it.
      Tensor in_place = ToCuda(x);
      ASSERT_TRUE(
          RotaryAtPositions(in_place, ToCuda(positions), options, &in_place)
              .ok());
      EXPECT_TRUE(SameBytes(in_place, got));
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
