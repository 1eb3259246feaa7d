// The paged-attention CUDA kernel (paged_attention_kernels.cuh), run on the
// host through cuda_emulator.h, against the CPU kernel
// (core/ops/paged_attention.cc): shuffled blocks, a partial last block, GQA,
// head_dim not a multiple of 32, a row with more keys than warps. Needs no
// GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/ops/paged_attention.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

// After every other header: it defines CUDA's keywords as macros.
#include "core/ops/cuda/emulated_device.h"
// The kernels, after the definitions they expect.
#include "core/ops/cuda/paged_attention_kernels.cuh"

namespace mcc {
namespace ops {
namespace {

namespace paged = ::mcc::cuda_kernels::paged;
using cuda_emu::Dim3;
using cuda_emu::Emulator;

Tensor Random(const Shape& shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(NumElements(shape));
  for (float& x : v) x = dist(gen);
  return *Tensor::FromVector(v, shape);
}

TEST(PagedAttentionEmulatedTest, MatchesTheCpuKernel) {
  struct Case {
    int64_t heads, groups, d, block_size, window_left;
  };
  for (const Case& c :
       {Case{4, 2, 40, 4, -1}, Case{2, 2, 64, 16, -1}, Case{8, 1, 16, 3, -1},
        Case{4, 2, 40, 4, 6}, Case{8, 1, 16, 3, 0}}) {
    SCOPED_TRACE(::testing::Message()
                 << "heads " << c.heads << " groups " << c.groups << " d "
                 << c.d << " block " << c.block_size << " window "
                 << c.window_left);
    // Block 16 of the pool holds NaNs: the table entries of blocks wholly
    // before a row's window point there, so reading one spoils the row.
    const int64_t blocks = 16, max_blocks = 8;
    const std::vector<int64_t> pos = {0, 13, 5, 20};
    const int64_t rows = static_cast<int64_t>(pos.size());
    std::vector<int64_t> order(blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(c.d));
    std::vector<int64_t> t(rows * max_blocks, 0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < max_blocks; ++b) {
        t[r * max_blocks + b] = order[(r * 3 + b) % blocks];
      }
    }
    if (c.window_left >= 0) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t first = std::max<int64_t>(0, pos[r] - c.window_left);
        for (int64_t b = 0; b < first / c.block_size; ++b) {
          t[r * max_blocks + b] = blocks;
        }
      }
    }
    const Tensor tables =
        *Tensor::FromInts(t, {rows, max_blocks}, DType::kInt32);
    const Tensor positions = *Tensor::FromInts(pos, {rows});
    const Tensor q = Random({rows, c.heads, c.d}, 1);
    Tensor k = Random({blocks + 1, c.block_size, c.groups, c.d}, 2);
    Tensor v = Random(k.shape(), 3);
    const int64_t block_elems = c.block_size * c.groups * c.d;
    for (Tensor* pool : {&k, &v}) {
      std::fill_n(pool->data<float>() + blocks * block_elems, block_elems,
                  std::numeric_limits<float>::quiet_NaN());
    }
    Tensor want = Tensor::Empty(q.shape(), DType::kFloat32);
    Tensor got = Tensor::Zeros(q.shape(), DType::kFloat32);
    ASSERT_TRUE(
        PagedAttention(q, k, v, tables, positions, &want, c.window_left).ok());
    paged::Params p;
    p.q = q.data<float>();
    p.k = k.data<float>();
    p.v = v.data<float>();
    p.tables = tables.data<int32_t>();
    p.positions = positions.data<int64_t>();
    p.out = got.data<float>();
    p.rows = rows;
    p.heads = c.heads;
    p.groups = c.groups;
    p.d = c.d;
    p.block_size = c.block_size;
    p.max_blocks = max_blocks;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    p.window_left = c.window_left;
    Emulator::Launch(Dim3{static_cast<unsigned int>(rows * c.heads), 1, 1},
                     paged::kThreads, paged::kSmemBytes,
                     [&] { paged::PagedAttentionKernel(p); });
    const std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
    for (size_t i = 0; i < g.size(); ++i) {
      // Softmax weights sum to one over values in [-1, 1]: the two orders
      // of summation differ by a few fp32 ulps.
      ASSERT_NEAR(g[i], w[i], 2e-6) << "element " << i;
    }
  }
}

TEST(PagedKvWriteEmulatedTest, MatchesTheCpuKernel) {
  const int64_t rows = 5, groups = 2, d = 24, blocks = 4, bs = 3;
  const Tensor k = Random({rows, groups, d}, 4);
  const Tensor v = Random({rows, groups, d}, 5);
  const Tensor slots = *Tensor::FromInts({7, 0, 11, 3, 4}, {rows});
  Tensor want_k = Random({blocks, bs, groups, d}, 6);
  Tensor want_v = Random(want_k.shape(), 7);
  Tensor got_k = want_k.Clone(), got_v = want_v.Clone();
  ASSERT_TRUE(PagedKvWrite(k, v, slots, &want_k, &want_v).ok());
  // Two blocks of 32 threads: the grid-stride loop goes round.
  Emulator::Launch(Dim3{2, 1, 1}, 32, 0, [&] {
    paged::PagedKvWriteKernel(k.data<float>(), v.data<float>(),
                              slots.data<int64_t>(), got_k.data<float>(),
                              got_v.data<float>(), rows, groups * d);
  });
  EXPECT_EQ(got_k.ToDoubles(), want_k.ToDoubles());
  EXPECT_EQ(got_v.ToDoubles(), want_v.ToDoubles());
}

TEST(RotaryAtPositionsEmulatedTest, MatchesTheCpuKernel) {
  const int64_t rows = 3, heads = 2, d = 20;
  const std::vector<int64_t> pos = {0, 17, 4000};
  const Tensor positions = *Tensor::FromInts(pos, {rows});
  for (int64_t rotary_dim : {int64_t{0}, int64_t{12}}) {
    for (DType yt : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(::testing::Message()
                   << "rotary_dim " << rotary_dim << " " << DTypeName(yt));
      RotaryOptions options;
      options.rotary_dim = rotary_dim;
      options.base = 500000;
      const Tensor x = Random({rows, heads, d}, 8);
      Tensor want = Tensor::Zeros(x.shape(), yt);
      Tensor got = Tensor::Zeros(x.shape(), yt);
      ASSERT_TRUE(RotaryAtPositions(x, positions, options, &want).ok());
      const int64_t rd = rotary_dim == 0 ? d : rotary_dim;
      paged::RotaryParams p;
      const std::vector<double> inv = RotaryInverseFrequencies(options, rd);
      std::copy(inv.begin(), inv.end(), p.inv_freq);
      p.positions = positions.data<int64_t>();
      p.x = x.raw_data();
      p.xt = cuda_kernels::ElemType::kF32;
      p.y = got.raw_data();
      p.yt = yt == DType::kFloat32 ? cuda_kernels::ElemType::kF32
                                   : cuda_kernels::ElemType::kBF16;
      p.rows = rows;
      p.heads = heads;
      p.d = d;
      p.rotary_dim = rd;
      Emulator::Launch(Dim3{1, 1, 1}, 64, 0,
                       [&] { paged::RotaryAtPositionsKernel(p); });
      const std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
      const double tol = yt == DType::kFloat32 ? 1e-6 : 1e-2;
      for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_NEAR(g[i], w[i], tol) << "element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
