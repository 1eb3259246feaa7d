// The paged-attention CUDA kernel (paged_attention_kernels.cuh), run on the
// host through cuda_emulator.h, against the CPU kernel
// (core/ops/paged_attention.cc): shuffled blocks, a partial last block, GQA,
// head_dim not a multiple of 32, a row with more keys than warps. Needs no
// GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
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
    int64_t heads, groups, d, block_size;
  };
  for (const Case& c :
       {Case{4, 2, 40, 4}, Case{2, 2, 64, 16}, Case{8, 1, 16, 3}}) {
    SCOPED_TRACE(::testing::Message()
                 << "heads " << c.heads << " groups " << c.groups << " d "
                 << c.d << " block " << c.block_size);
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
    const Tensor tables =
        *Tensor::FromInts(t, {rows, max_blocks}, DType::kInt32);
    const Tensor positions = *Tensor::FromInts(pos, {rows});
    const Tensor q = Random({rows, c.heads, c.d}, 1);
    const Tensor k = Random({blocks, c.block_size, c.groups, c.d}, 2);
    const Tensor v = Random(k.shape(), 3);
    Tensor want = Tensor::Empty(q.shape(), DType::kFloat32);
    Tensor got = Tensor::Zeros(q.shape(), DType::kFloat32);
    ASSERT_TRUE(PagedAttention(q, k, v, tables, positions, &want).ok());
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

}  // namespace
}  // namespace ops
}  // namespace mcc
