// The tensor-core flash-attention forward (flash_attention_mma_kernels.cuh)
// run on the host through cuda_emulator.h, its mma.m16n8k16 products
// through mma_tile.cuh's emulation of the PTX fragment layouts, against the
// CPU kernel. Needs no GPU: CI checks the kernel body's fragment indexing,
// tiling, online softmax, masking (causal, first_key documents and windows,
// rows that see no key), GQA, dropout words and ragged last tiles; the GPU
// run (flash_attention_test) checks the same body as nvcc compiles it.
//
// Tolerance: flash_attention_test_util.h's bounds for the tensor-core
// forward (TensorCoreForward: the fp32 kernel's bound with its score and
// P V accumulation terms doubled for truncating adds, plus P's rounding to
// bf16 or fp16, u_p M_ix, and fp16's subnormal flush of P). The emulation
// rounds to nearest, so it sits well inside; a planted fragment-layout
// fault gives errors of the order of the values and fails it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/cuda/flash_attention_test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

// After every other header: it defines CUDA's keywords as macros.
#include "core/ops/cuda/emulated_device.h"
// The kernels, after the definitions they expect.
#include "core/ops/cuda/flash_attention_mma_kernels.cuh"
// After the kernels' Params.
#include "core/ops/cuda/flash_attention_emulated_params.h"

namespace mcc {
namespace ops {
namespace {

namespace flash = ::mcc::cuda_kernels::flash;
namespace mma = ::mcc::cuda_kernels::mma;
using cuda_emu::Emulator;
using flash_testing::AttentionCase;
using flash_testing::Near;

::testing::Environment* const kWidenedCpuBf16 =
    ::testing::AddGlobalTestEnvironment(
        new flash_testing::WidenedCpuBf16Attention);

template <int kD, mma::Input kIn>
void Launch(const flash::Params& p) {
  Emulator::Launch(flash_testing::DimOf(flash::MmaForwardGrid<kD>(p)),
                   flash::kMmaThreads, flash::MmaSmem<kD>::kForward,
                   [&] { flash::MmaForwardKernel<kD, kIn>(p); });
}

// The tensor-core forward as flash_attention.cu launches it.
void MmaForward(const AttentionCase& c, const AttentionOptions& o,
                const flash_testing::HostInputs& in,
                flash_testing::Results* r) {
  flash::Params p = flash_testing::ParamsFor(c, o);
  flash_testing::SetForwardTensors(in, r, &p);
  const bool bf16 = c.dtype == DType::kBFloat16;
  ASSERT_TRUE(bf16 || c.dtype == DType::kFloat16);
  ASSERT_TRUE(c.d == 64 || c.d == 128);
  if (c.d == 64) {
    bf16 ? Launch<64, mma::Input::kBF16>(p) : Launch<64, mma::Input::kF16>(p);
  } else {
    bf16 ? Launch<128, mma::Input::kBF16>(p) : Launch<128, mma::Input::kF16>(p);
  }
}

// Runs the case on both kernels; returns whether out and lse are within
// the tensor-core bounds (lse: -inf rows equal, the rest within bound).
::testing::AssertionResult MatchesCpu(const AttentionCase& c,
                                      const AttentionOptions& o,
                                      uint32_t seed) {
  const flash_testing::HostInputs in = flash_testing::MakeInputs(c, seed);
  flash_testing::Results want = flash_testing::EmptyResults(c, Device::CPU());
  flash_testing::Results got = flash_testing::EmptyResults(c, Device::CPU());
  if (!FlashAttentionForward(in.q, in.k, in.v, o, &want.out, &want.lse).ok()) {
    return ::testing::AssertionFailure() << "the CPU kernel failed";
  }
  MmaForward(c, o, in, &got);
  const flash_testing::Bounds bd = flash_testing::AttentionBounds(
      c, in, want.out, want.lse, flash_testing::TensorCoreForward(c.dtype),
      o.first_key);
  ::testing::AssertionResult out = Near("out", got.out, want.out, bd.out);
  if (!out) return out;
  // How much of the bound the errors use (the worst element's ratio).
  const std::vector<double> go = got.out.ToDoubles(), wo = want.out.ToDoubles();
  double worst = 0.0;
  for (size_t i = 0; i < go.size(); ++i) {
    worst = std::max(
        worst,
        std::fabs(go[i] - wo[i]) /
            (bd.out[i] +
             flash_testing::Ulp(got.out.dtype(), std::fabs(wo[i]) + bd.out[i]) +
             1e-30));
  }
  std::printf("%s: worst out error / bound %.3f\n", c.Name().c_str(), worst);
  const std::vector<double> gl = got.lse.ToDoubles(), wl = want.lse.ToDoubles();
  for (size_t i = 0; i < gl.size(); ++i) {
    const bool ok = std::isinf(wl[i]) ? std::isinf(gl[i]) && gl[i] < 0
                                      : std::fabs(gl[i] - wl[i]) <= bd.lse[i];
    if (!ok) {
      return ::testing::AssertionFailure()
             << "lse row " << i << ": got " << gl[i] << ", want " << wl[i]
             << ", bound " << bd.lse[i];
    }
  }
  return ::testing::AssertionSuccess();
}

const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16,
            f32 = DType::kFloat32;

// Several query and key tiles with a ragged last one (150 = 2 x 64 + 22),
// causal and not, GQA 4:2 and 4:1, both 16-bit types, fp32 and 16-bit
// outputs, dropout (also on a tensor-parallel rank's heads).
TEST(FlashAttentionMmaEmulatedTest, MatchesTheCpuKernel) {
  const std::vector<AttentionCase> cases = {
      {2, 150, 4, 2, 64, true, bf16, bf16, f32},
      {1, 129, 2, 1, 128, false, f16, f32, f32},
      {1, 97, 4, 1, 128, true, bf16, f32, f32, 0.1f},
      {2, 70, 2, 1, 64, false, f16, f16, f32, 0.2f, 2, 8},
      {1, 1, 2, 2, 64, true, bf16, bf16, f32},
  };
  uint32_t seed = 300;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(c.Name());
    EXPECT_TRUE(MatchesCpu(c, c.Options(), seed++));
  }
}

TEST(FlashAttentionMmaEmulatedTest, FirstKeysMatchTheCpuKernel) {
  uint32_t seed = 400;
  for (const AttentionCase& c : std::vector<AttentionCase>{
           {2, 150, 4, 2, 64, true, bf16, bf16, f32},
           {2, 150, 4, 1, 128, true, f16, f32, f32, 0.1f},
           {2, 150, 2, 2, 128, false, bf16, bf16, f32},
       }) {
    SCOPED_TRACE(c.Name());
    EXPECT_TRUE(MatchesCpu(c, flash_testing::WithFirstKeys(c), seed++));
  }
}

// Packed documents cost less: with 64-token documents in a causal
// sequence of 256, every query tile runs its diagonal key step only (4 of
// the 10 steps that plain causal attention runs), so 4/10 the products.
TEST(FlashAttentionMmaEmulatedTest, DocumentsSkipTheirEarlierKeySteps) {
  const AttentionCase c = {1, 256, 1, 1, 64, true, bf16, bf16, f32};
  const AttentionOptions plain = c.Options();
  AttentionOptions docs = c.Options();
  std::vector<int64_t> first;
  for (int64_t i = 0; i < c.s; ++i) first.push_back(i / 64 * 64);
  docs.first_key = *Tensor::FromInts(first, {c.b, c.s}, DType::kInt32);
  mma::emulated_products = 0;
  EXPECT_TRUE(MatchesCpu(c, plain, 600));
  const int64_t plain_products = mma::emulated_products;
  mma::emulated_products = 0;
  EXPECT_TRUE(MatchesCpu(c, docs, 600));
  EXPECT_GT(plain_products, 0);
  EXPECT_EQ(mma::emulated_products * 10, plain_products * 4);
}

// The bound sees a wrong fragment layout: each planted fault in the
// emulation's reading of A, B or C fails it, on plain causal attention.
TEST(FlashAttentionMmaEmulatedTest, PlantedLayoutFaultsFail) {
  const AttentionCase c = {1, 70, 2, 1, 64, true, bf16, bf16, f32};
  for (int fault = 1; fault <= 3; ++fault) {
    SCOPED_TRACE("fault " + std::to_string(fault));
    mma::emulated_layout_fault = fault;
    EXPECT_FALSE(MatchesCpu(c, c.Options(), 500));
    mma::emulated_layout_fault = 0;
  }
  EXPECT_TRUE(MatchesCpu(c, c.Options(), 500));
}

}  // namespace
}  // namespace ops
}  // namespace mcc
