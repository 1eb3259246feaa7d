// The tensor-core flash-attention backward
// (flash_attention_mma_backward_kernels.cuh) run on the host through
// cuda_emulator.h, its mma.m16n8k16 products through mma_tile.cuh's
// emulation of the PTX fragment layouts, against the CPU kernel's dq, dk and
// dv. Both backward kernels get the CPU forward's out and lse, so the
// comparison sees the tensor-core backward's error only. Needs no GPU: CI
// checks the kernels' fragment indexing, tiling, masking (causal, first_key
// documents and windows, rows that see no key), GQA sums, dropout words and
// ragged last tiles; the GPU run (flash_attention_test) checks the same
// bodies as nvcc compiles them.
//
// Tolerance: flash_attention_test_util.h's bounds for the tensor-core
// backward (TensorCoreBackward: the fp32 bound with its accumulation terms
// doubled for truncating adds, plus the rounding of P c and dS, and of dO
// when its type is not q's, to q's 16-bit type). The emulation rounds to
// nearest, so it sits inside; a planted fragment-layout fault fails it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/cuda/flash_attention_test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

// After every other header: it defines CUDA's keywords as macros.
#include "core/ops/cuda/emulated_device.h"
// The kernels, after the definitions they expect.
#include "core/ops/cuda/flash_attention_mma_backward_kernels.cuh"
// After the kernels' Params.
#include "core/ops/cuda/flash_attention_emulated_params.h"

namespace mcc {
namespace ops {
namespace {

namespace flash = ::mcc::cuda_kernels::flash;
namespace mma = ::mcc::cuda_kernels::mma;
using cuda_emu::Emulator;
using flash_testing::AttentionCase;
using flash_testing::DimOf;
using flash_testing::ElemTypeOf;

::testing::Environment* const kWidenedCpuBf16 =
    ::testing::AddGlobalTestEnvironment(
        new flash_testing::WidenedCpuBf16Attention);

// D, then the two tensor-core kernels, as flash_attention.cu launches them.
template <int kD, mma::Input kIn>
void Launch(const flash::Params& p) {
  Emulator::Launch(DimOf(flash::RowDotGrid(p)), flash::kThreads, 0,
                   [&] { flash::RowDotKernel(p); });
  Emulator::Launch(DimOf(flash::MmaKvGradGrid<kD>(p)), flash::kMmaThreads,
                   flash::MmaBackwardSmem<kD>::kKvGrad,
                   [&] { flash::MmaKvGradKernel<kD, kIn>(p); });
  Emulator::Launch(DimOf(flash::MmaQGradGrid<kD>(p)), flash::kMmaThreads,
                   flash::MmaBackwardSmem<kD>::kQGrad,
                   [&] { flash::MmaQGradKernel<kD, kIn>(p); });
}

void MmaBackward(const AttentionCase& c, const AttentionOptions& o,
                 const flash_testing::HostInputs& in, const Tensor& out,
                 const Tensor& lse, flash_testing::Results* r) {
  flash::Params p = flash_testing::ParamsFor(c, o);
  std::vector<float> row_dot(c.b * c.hq * c.s);
  flash_testing::SetBackwardTensors(in, out, lse, &row_dot, r, &p);
  const bool bf16 = c.dtype == DType::kBFloat16;
  ASSERT_TRUE(bf16 || c.dtype == DType::kFloat16);
  ASSERT_TRUE(c.d == 64 || c.d == 128);
  if (c.d == 64) {
    bf16 ? Launch<64, mma::Input::kBF16>(p) : Launch<64, mma::Input::kF16>(p);
  } else {
    bf16 ? Launch<128, mma::Input::kBF16>(p) : Launch<128, mma::Input::kF16>(p);
  }
}

// The worst |got - want| / bound of a result (Near's bound).
double WorstRatio(const Tensor& got, const Tensor& want,
                  const std::vector<double>& bound) {
  const std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
  double worst = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    worst = std::max(worst, std::fabs(g[i] - w[i]) /
                                (bound[i] +
                                 flash_testing::Ulp(
                                     got.dtype(), std::fabs(w[i]) + bound[i]) +
                                 1e-30));
  }
  return worst;
}

// Runs the case's backward on both kernels; returns whether dq, dk and dv
// are within the tensor-core bounds.
::testing::AssertionResult MatchesCpu(const AttentionCase& c,
                                      const AttentionOptions& o,
                                      uint32_t seed) {
  const flash_testing::HostInputs in = flash_testing::MakeInputs(c, seed);
  flash_testing::Results want = flash_testing::EmptyResults(c, Device::CPU());
  flash_testing::Results got = flash_testing::EmptyResults(c, Device::CPU());
  if (!FlashAttentionForward(in.q, in.k, in.v, o, &want.out, &want.lse).ok() ||
      !FlashAttentionBackward(in.q, in.k, in.v, want.out, in.dout, want.lse, o,
                              &want.dq, &want.dk, &want.dv)
           .ok()) {
    return ::testing::AssertionFailure() << "the CPU kernel failed";
  }
  MmaBackward(c, o, in, want.out, want.lse, &got);
  const flash_testing::Bounds bd = flash_testing::AttentionBounds(
      c, in, want.out, want.lse, {}, o.first_key,
      flash_testing::TensorCoreBackward(c.dtype, c.out_dtype));
  std::printf("%s: worst error / bound dq %.3f dk %.3f dv %.3f\n",
              c.Name().c_str(), WorstRatio(got.dq, want.dq, bd.dq),
              WorstRatio(got.dk, want.dk, bd.dk),
              WorstRatio(got.dv, want.dv, bd.dv));
  for (::testing::AssertionResult r :
       {flash_testing::Near("dq", got.dq, want.dq, bd.dq),
        flash_testing::Near("dk", got.dk, want.dk, bd.dk),
        flash_testing::Near("dv", got.dv, want.dv, bd.dv)}) {
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16,
            f32 = DType::kFloat32;

// Several query and key tiles with a ragged last one (150 = 2 x 64 + 22),
// causal and not, GQA 4:2 and 2:1 (dK and dV summed over the group), both
// 16-bit types, dO of q's type and fp32 (rounded), fp32 and 16-bit
// gradients, dropout (also on a tensor-parallel rank's heads), s = 1.
TEST(FlashAttentionMmaBackwardEmulatedTest, MatchesTheCpuKernel) {
  const std::vector<AttentionCase> cases = {
      {1, 150, 4, 2, 64, true, bf16, bf16, f32},
      {1, 129, 2, 1, 128, false, f16, f32, f32},
      {1, 97, 2, 1, 128, true, bf16, bf16, bf16, 0.1f},
      {2, 70, 2, 1, 64, false, f16, f16, f16, 0.2f, 2, 8},
      {1, 1, 2, 2, 64, true, bf16, bf16, f32},
  };
  uint32_t seed = 700;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(c.Name());
    EXPECT_TRUE(MatchesCpu(c, c.Options(), seed++));
  }
}

// Packed documents of 70, 1, 40 and 39 tokens with a 30-key window (causal;
// key tiles before a tile's first key skipped in both kernels), and key
// ranges before, inside and past the rows' own leaving rows with no key
// (not causal).
TEST(FlashAttentionMmaBackwardEmulatedTest, FirstKeysMatchTheCpuKernel) {
  uint32_t seed = 800;
  for (const AttentionCase& c : std::vector<AttentionCase>{
           {1, 150, 4, 2, 64, true, bf16, bf16, f32, 0.1f},
           {1, 150, 2, 1, 128, false, f16, f16, f32},
       }) {
    SCOPED_TRACE(c.Name());
    EXPECT_TRUE(MatchesCpu(c, flash_testing::WithFirstKeys(c), seed++));
  }
}

// Packed documents cost less: with 64-token documents in a causal sequence
// of 256, each key tile meets only its own query tile in MmaKvGradKernel,
// and each query tile only its own key tile in MmaQGradKernel: 4 of the 10
// tile pairs plain causal attention runs, so 4/10 the products.
TEST(FlashAttentionMmaBackwardEmulatedTest, DocumentsSkipTheirEarlierTiles) {
  const AttentionCase c = {1, 256, 1, 1, 64, true, bf16, bf16, f32};
  AttentionOptions docs = c.Options();
  std::vector<int64_t> first;
  for (int64_t i = 0; i < c.s; ++i) first.push_back(i / 64 * 64);
  docs.first_key = *Tensor::FromInts(first, {c.b, c.s}, DType::kInt32);
  mma::emulated_products = 0;
  EXPECT_TRUE(MatchesCpu(c, c.Options(), 600));
  const int64_t plain_products = mma::emulated_products;
  mma::emulated_products = 0;
  EXPECT_TRUE(MatchesCpu(c, docs, 600));
  EXPECT_GT(plain_products, 0);
  EXPECT_EQ(mma::emulated_products * 10, plain_products * 4);
}

// The bound sees a wrong fragment layout: each planted fault in the
// emulation's reading of A, B or C fails it.
TEST(FlashAttentionMmaBackwardEmulatedTest, PlantedLayoutFaultsFail) {
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
