// The flash-attention CUDA kernels (flash_attention_kernels.cuh), run on the
// host through cuda_emulator.h, against the CPU kernel on the cases and
// bounds of flash_attention_test_util.h. Needs no GPU: it checks the
// kernels' indexing, tiling, masking, dropout stream, GQA sums and
// synchronisation in CI; the GPU run (flash_attention_test) then checks the
// same kernels as nvcc compiles them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/cuda/elem_type.h"
#include "core/ops/cuda/flash_attention_test_util.h"
#include "core/ops/dropout.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

// After every other header: it defines CUDA's keywords as macros.
#include "core/ops/cuda/emulated_device.h"
// The kernels, after the definitions they expect.
#include "core/ops/cuda/flash_attention_kernels.cuh"
// After the kernels' Params.
#include "core/ops/cuda/flash_attention_emulated_params.h"

namespace mcc {
namespace ops {
namespace {

namespace flash = ::mcc::cuda_kernels::flash;
using cuda_emu::Dim3;
using cuda_emu::Emulator;
using flash_testing::AttentionCase;
using flash_testing::Near;

::testing::Environment* const kWidenedCpuBf16 =
    ::testing::AddGlobalTestEnvironment(
        new flash_testing::WidenedCpuBf16Attention);

using flash_testing::DimOf;
using flash_testing::ElemTypeOf;
using flash_testing::ParamsFor;

template <int kD>
void Forward(const flash::Params& p) {
  Emulator::Launch(DimOf(flash::ForwardGrid<kD>(p)), flash::kThreads,
                   flash::Smem<kD>::kForward,
                   [&] { flash::ForwardKernel<kD>(p); });
}

template <int kD>
void Backward(const flash::Params& p) {
  Emulator::Launch(DimOf(flash::RowDotGrid(p)), flash::kThreads, 0,
                   [&] { flash::RowDotKernel(p); });
  Emulator::Launch(DimOf(flash::KvGradGrid<kD>(p)), flash::kThreads,
                   flash::Smem<kD>::kKvGrad,
                   [&] { flash::KvGradKernel<kD>(p); });
  Emulator::Launch(DimOf(flash::QGradGrid<kD>(p)), flash::kThreads,
                   flash::Smem<kD>::kQGrad, [&] { flash::QGradKernel<kD>(p); });
}

template <typename Fn>
void ForHeadDim(int64_t d, Fn&& fn) {
  switch (flash::PaddedHeadDim(d)) {
    case 64:
      fn(std::integral_constant<int, 64>{});
      break;
    case 128:
      fn(std::integral_constant<int, 128>{});
      break;
    case 256:
      fn(std::integral_constant<int, 256>{});
      break;
    default:
      FAIL() << "head dim " << d;
  }
}

void EmulatedForward(const AttentionCase& c, const AttentionOptions& o,
                     const flash_testing::HostInputs& in,
                     flash_testing::Results* r) {
  flash::Params p = ParamsFor(c, o);
  flash_testing::SetForwardTensors(in, r, &p);
  ForHeadDim(c.d, [&](auto kd) { Forward<decltype(kd)::value>(p); });
}

void EmulatedBackward(const AttentionCase& c, const AttentionOptions& o,
                      const flash_testing::HostInputs& in, const Tensor& out,
                      const Tensor& lse, flash_testing::Results* r) {
  flash::Params p = ParamsFor(c, o);
  std::vector<float> row_dot(c.b * c.hq * c.s);
  flash_testing::SetBackwardTensors(in, out, lse, &row_dot, r, &p);
  ForHeadDim(c.d, [&](auto kd) { Backward<decltype(kd)::value>(p); });
}

TEST(FlashAttentionEmulatedTest, PhiloxWordsAreTheCpuStream) {
  for (uint64_t seed : {0ull, 42ull, 0xfedcba9876543210ull}) {
    const uint64_t first =
        (1ull << 32) * 4 - 5;  // The counter's low word wraps.
    std::vector<uint32_t> want(64);
    PhiloxStream(seed, first, 64, want.data());
    for (int i = 0; i < 64; ++i) {
      ASSERT_EQ(flash::PhiloxWord(seed, first + i), want[i])
          << "seed " << seed << " word " << first + i;
    }
  }
}

TEST(FlashAttentionEmulatedTest, ForwardAndBackwardMatchTheCpuKernel) {
  uint32_t seed = 7;
  for (const AttentionCase& c : flash_testing::Cases()) {
    SCOPED_TRACE(c.Name());
    const AttentionOptions o = c.Options();
    const flash_testing::HostInputs in = flash_testing::MakeInputs(c, seed++);
    flash_testing::Results want = flash_testing::EmptyResults(c, Device::CPU());
    flash_testing::Results got = flash_testing::EmptyResults(c, Device::CPU());
    ASSERT_TRUE(
        FlashAttentionForward(in.q, in.k, in.v, o, &want.out, &want.lse).ok());
    EmulatedForward(c, o, in, &got);
    const flash_testing::Bounds bd =
        flash_testing::AttentionBounds(c, in, want.out, want.lse);
    EXPECT_TRUE(Near("out", got.out, want.out, bd.out));
    EXPECT_TRUE(Near("lse", got.lse, want.lse, bd.lse));
    ASSERT_TRUE(FlashAttentionBackward(in.q, in.k, in.v, want.out, in.dout,
                                       want.lse, o, &want.dq, &want.dk,
                                       &want.dv)
                    .ok());
    EmulatedBackward(c, o, in, want.out, want.lse, &got);
    EXPECT_TRUE(Near("dq", got.dq, want.dq, bd.dq));
    EXPECT_TRUE(Near("dk", got.dk, want.dk, bd.dk));
    EXPECT_TRUE(Near("dv", got.dv, want.dv, bd.dv));
  }
}

// Packed documents and sliding windows (AttentionOptions::first_key): the
// kernels skip tiles before each tile's first key and mask the rest as the
// CPU kernel does, rows that see no key included (a CP ring step's).
TEST(FlashAttentionEmulatedTest, FirstKeysMatchTheCpuKernel) {
  uint32_t seed = 70;
  for (int64_t d : {64, 100, 256}) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool causal = variant < 2;
      const AttentionCase c = {2,
                               150,
                               4,
                               2,
                               d,
                               causal,
                               DType::kFloat32,
                               DType::kFloat32,
                               DType::kFloat32,
                               variant == 1 ? 0.1f : 0.0f};
      SCOPED_TRACE(c.Name() + " variant " + std::to_string(variant));
      const AttentionOptions o = flash_testing::WithFirstKeys(c);
      const flash_testing::HostInputs in = flash_testing::MakeInputs(c, seed++);
      flash_testing::Results want =
          flash_testing::EmptyResults(c, Device::CPU());
      flash_testing::Results got =
          flash_testing::EmptyResults(c, Device::CPU());
      ASSERT_TRUE(
          FlashAttentionForward(in.q, in.k, in.v, o, &want.out, &want.lse)
              .ok());
      EmulatedForward(c, o, in, &got);
      const flash_testing::Bounds bd = flash_testing::AttentionBounds(
          c, in, want.out, want.lse, {}, o.first_key);
      EXPECT_TRUE(Near("out", got.out, want.out, bd.out));
      // -inf rows compare equal; the bound covers the finite ones.
      std::vector<double> gl = got.lse.ToDoubles(), wl = want.lse.ToDoubles();
      int empty = 0;
      for (size_t i = 0; i < gl.size(); ++i) {
        if (std::isinf(wl[i])) {
          ++empty;
          EXPECT_TRUE(std::isinf(gl[i]) && gl[i] < 0) << "lse row " << i;
        }
      }
      EXPECT_EQ(empty > 0, !causal);
      if (causal) EXPECT_TRUE(Near("lse", got.lse, want.lse, bd.lse));
      ASSERT_TRUE(FlashAttentionBackward(in.q, in.k, in.v, want.out, in.dout,
                                         want.lse, o, &want.dq, &want.dk,
                                         &want.dv)
                      .ok());
      EmulatedBackward(c, o, in, want.out, want.lse, &got);
      EXPECT_TRUE(Near("dq", got.dq, want.dq, bd.dq));
      EXPECT_TRUE(Near("dk", got.dk, want.dk, bd.dk));
      EXPECT_TRUE(Near("dv", got.dv, want.dv, bd.dv));
    }
  }
}

// The bounds are tight enough to see a wrong mask: the same kernel drawing
// from a stream shifted by one word fails them.
TEST(FlashAttentionEmulatedTest, ABoundSeesAShiftedDropoutStream) {
  const AttentionCase c = {1,
                           33,
                           2,
                           1,
                           64,
                           true,
                           DType::kFloat32,
                           DType::kFloat32,
                           DType::kFloat32,
                           0.1f};
  const flash_testing::HostInputs in = flash_testing::MakeInputs(c, 99);
  flash_testing::Results want = flash_testing::EmptyResults(c, Device::CPU());
  flash_testing::Results got = flash_testing::EmptyResults(c, Device::CPU());
  const AttentionOptions o = c.Options();
  ASSERT_TRUE(
      FlashAttentionForward(in.q, in.k, in.v, o, &want.out, &want.lse).ok());
  AttentionOptions shifted = o;
  shifted.dropout_offset += 1;
  EmulatedForward(c, shifted, in, &got);
  const flash_testing::Bounds bd =
      flash_testing::AttentionBounds(c, in, want.out, want.lse);
  EXPECT_FALSE(Near("out", got.out, want.out, bd.out));
  EXPECT_TRUE(Near("lse", got.lse, want.lse, bd.lse));  // lse is undropped.
}

}  // namespace
}  // namespace ops
}  // namespace mcc
