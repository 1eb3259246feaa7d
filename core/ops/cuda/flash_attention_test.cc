// ops::FlashAttentionForward and ops::FlashAttentionBackward on CUDA tensors
// (the kernels of flash_attention.cu, registered by registrations.cc)
// against the CPU kernel on the same random inputs: the cases and the
// bounds derived in flash_attention_test_util.h (causal and not, GQA, odd
// sequence lengths 1 to 129, head dims 33 to 256, fp32, bf16 and
// fp16 inputs, 16-bit inputs with fp32 outputs, dropout with the CPU's
// masks, also on a tensor-parallel rank's heads). The backward of both is
// given the CPU forward's out and lse, so each comparison sees one kernel's
// error. Skips without a CUDA device (the *_on_test_device build runs every
// line in CI against the CPU kernels; see test_util.h).
#include "core/ops/cuda/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/cuda/flash_attention_test_util.h"
#include "core/ops/cuda/test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using flash_testing::AttentionCase;
using flash_testing::Near;

::testing::Environment* const kWidenedCpuBf16 =
    ::testing::AddGlobalTestEnvironment(
        new flash_testing::WidenedCpuBf16Attention);
using testing::CudaTest;
using testing::KernelDevice;
using testing::SameBytes;
using testing::ToCuda;
using testing::ToHost;

class CudaFlashAttentionTest : public CudaTest {};

// The forward's arithmetic on this case: 16-bit inputs with head dim 64 or
// 128 may take the tensor-core kernel (FlashAttentionForwardKernelFor), whose
// bound is looser; the SIMT kernel and the test device's CPU kernel sit
// inside it too.
bool MayUseTensorCores(const AttentionCase& c) {
  return c.dtype != DType::kFloat32 && (c.d == 64 || c.d == 128);
}

flash_testing::ForwardArithmetic ForwardArithmeticOf(const AttentionCase& c) {
  return MayUseTensorCores(c) ? flash_testing::TensorCoreForward(c.dtype)
                              : flash_testing::ForwardArithmetic{};
}

// Likewise the backward (FlashAttentionBackwardKernelFor).
flash_testing::BackwardArithmetic BackwardArithmeticOf(const AttentionCase& c) {
  return MayUseTensorCores(c)
             ? flash_testing::TensorCoreBackward(c.dtype, c.out_dtype)
             : flash_testing::BackwardArithmetic{};
}

// On a GPU (not the test device): whether the tensor-core kernels are the
// ones picked for 16-bit q, k, v, dout of head dim c.d, exactly when the
// device is sm_80+.
void ExpectTensorCoresPicked(const AttentionCase& c, const Tensor& q,
                             const Tensor& k, const Tensor& v,
                             const Tensor& dout) {
  if (testing::OnTestDevice()) return;
  int major = 0;
  ASSERT_EQ(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0),
      cudaSuccess);
  cuda_kernels::FlashAttentionArgs args;
  args.head_dim = c.d;
  const cuda_kernels::ElemType qt = c.dtype == DType::kBFloat16
                                        ? cuda_kernels::ElemType::kBF16
                                        : cuda_kernels::ElemType::kF16;
  EXPECT_EQ(cuda_kernels::FlashAttentionForwardKernelFor(
                args, q.raw_data(), k.raw_data(), v.raw_data(), qt) ==
                cuda_kernels::FlashKernel::kTensorCore,
            major >= 8);
  EXPECT_EQ(cuda_kernels::FlashAttentionBackwardKernelFor(
                args, q.raw_data(), k.raw_data(), v.raw_data(), dout.raw_data(),
                qt) == cuda_kernels::FlashKernel::kTensorCore,
            major >= 8);
  // tensor_cores = false pins the SIMT kernels.
  args.tensor_cores = false;
  EXPECT_EQ(
      cuda_kernels::FlashAttentionBackwardKernelFor(
          args, q.raw_data(), k.raw_data(), v.raw_data(), dout.raw_data(), qt),
      cuda_kernels::FlashKernel::kSimt);
}

TEST(CudaFlashAttentionSlotsTest, HoldCudaKernels) {
  EXPECT_TRUE(FlashAttentionForwardKernels().Get(Device::CUDA(0)).ok());
  EXPECT_TRUE(FlashAttentionBackwardKernels().Get(Device::CUDA(0)).ok());
}

TEST_F(CudaFlashAttentionTest, MatchesTheCpuKernel) {
  uint32_t seed = 11;
  for (const AttentionCase& c : flash_testing::Cases()) {
    SCOPED_TRACE(c.Name());
    const AttentionOptions o = c.Options();
    const flash_testing::HostInputs in = flash_testing::MakeInputs(c, seed++);
    flash_testing::Results want = flash_testing::EmptyResults(c, Device::CPU());
    flash_testing::Results got = flash_testing::EmptyResults(c, KernelDevice());
    const Tensor q = ToCuda(in.q), k = ToCuda(in.k), v = ToCuda(in.v),
                 dout = ToCuda(in.dout);
    ASSERT_TRUE(
        FlashAttentionForward(in.q, in.k, in.v, o, &want.out, &want.lse).ok());
    const absl::Status fwd =
        FlashAttentionForward(q, k, v, o, &got.out, &got.lse);
    ASSERT_TRUE(fwd.ok()) << fwd;
    const flash_testing::Bounds bd = flash_testing::AttentionBounds(
        c, in, want.out, want.lse, ForwardArithmeticOf(c), Tensor(),
        BackwardArithmeticOf(c));
    EXPECT_TRUE(Near("out", ToHost(got.out), want.out, bd.out));
    EXPECT_TRUE(Near("lse", ToHost(got.lse), want.lse, bd.lse));

    ASSERT_TRUE(FlashAttentionBackward(in.q, in.k, in.v, want.out, in.dout,
                                       want.lse, o, &want.dq, &want.dk,
                                       &want.dv)
                    .ok());
    const Tensor out = ToCuda(want.out), lse = ToCuda(want.lse);
    const absl::Status bwd = FlashAttentionBackward(q, k, v, out, dout, lse, o,
                                                    &got.dq, &got.dk, &got.dv);
    ASSERT_TRUE(bwd.ok()) << bwd;
    EXPECT_TRUE(Near("dq", ToHost(got.dq), want.dq, bd.dq));
    EXPECT_TRUE(Near("dk", ToHost(got.dk), want.dk, bd.dk));
    EXPECT_TRUE(Near("dv", ToHost(got.dv), want.dv, bd.dv));

    // No atomics: a second run gives the same bits.
    flash_testing::Results again =
        flash_testing::EmptyResults(c, KernelDevice());
    ASSERT_TRUE(FlashAttentionForward(q, k, v, o, &again.out, &again.lse).ok());
    ASSERT_TRUE(FlashAttentionBackward(q, k, v, out, dout, lse, o, &again.dq,
                                       &again.dk, &again.dv)
                    .ok());
    EXPECT_TRUE(SameBytes(again.out, got.out));
    EXPECT_TRUE(SameBytes(again.dq, got.dq));
    EXPECT_TRUE(SameBytes(again.dk, got.dk));
    EXPECT_TRUE(SameBytes(again.dv, got.dv));
  }
}

// Packed documents with a sliding window (AttentionOptions::first_key, on
// the host; the op copies it to the device): the CPU kernel's results.
TEST_F(CudaFlashAttentionTest, FirstKeysMatchTheCpuKernel) {
  const AttentionCase c = {2,
                           150,
                           4,
                           2,
                           128,
                           true,
                           DType::kBFloat16,
                           DType::kBFloat16,
                           DType::kFloat32};
  std::vector<int64_t> first;
  for (int64_t bi = 0; bi < c.b; ++bi) {
    for (int64_t i = 0; i < c.s; ++i) {
      const int64_t start = bi == 0 ? (i < 70 ? 0 : i < 71 ? 70 : 71) : 0;
      first.push_back(std::max<int64_t>(start, i - 29));
    }
  }
  AttentionOptions o = c.Options();
  o.first_key = *Tensor::FromInts(first, {c.b, c.s}, DType::kInt32);
  const flash_testing::HostInputs in = flash_testing::MakeInputs(c, 5);
  flash_testing::Results want = flash_testing::EmptyResults(c, Device::CPU());
  flash_testing::Results got = flash_testing::EmptyResults(c, KernelDevice());
  const Tensor q = ToCuda(in.q), k = ToCuda(in.k), v = ToCuda(in.v),
               dout = ToCuda(in.dout);
  ASSERT_TRUE(
      FlashAttentionForward(in.q, in.k, in.v, o, &want.out, &want.lse).ok());
  const absl::Status fwd =
      FlashAttentionForward(q, k, v, o, &got.out, &got.lse);
  ASSERT_TRUE(fwd.ok()) << fwd;
  const flash_testing::Bounds bd = flash_testing::AttentionBounds(
      c, in, want.out, want.lse, ForwardArithmeticOf(c), o.first_key,
      BackwardArithmeticOf(c));
  EXPECT_TRUE(Near("out", ToHost(got.out), want.out, bd.out));
  EXPECT_TRUE(Near("lse", ToHost(got.lse), want.lse, bd.lse));
  ASSERT_TRUE(FlashAttentionBackward(in.q, in.k, in.v, want.out, in.dout,
                                     want.lse, o, &want.dq, &want.dk, &want.dv)
                  .ok());
  const Tensor out = ToCuda(want.out), lse = ToCuda(want.lse);
  const absl::Status bwd = FlashAttentionBackward(q, k, v, out, dout, lse, o,
                                                  &got.dq, &got.dk, &got.dv);
  ASSERT_TRUE(bwd.ok()) << bwd;
  EXPECT_TRUE(Near("dq", ToHost(got.dq), want.dq, bd.dq));
  EXPECT_TRUE(Near("dk", ToHost(got.dk), want.dk, bd.dk));
  EXPECT_TRUE(Near("dv", ToHost(got.dv), want.dv, bd.dv));
}

// The tensor-core tests' first keys: documents of 70, 1 and 79 tokens with a
// 30-key window (causal); not causal, key ranges before, inside and past the
// rows' own, leaving rows that see keys past theirs or none.
Tensor TensorCoreCaseFirstKeys(const AttentionCase& c) {
  std::vector<int64_t> first;
  for (int64_t bi = 0; bi < c.b; ++bi) {
    for (int64_t i = 0; i < c.s; ++i) {
      const int64_t start = i < 70 ? 0 : i < 71 ? 70 : 71;
      first.push_back(c.causal ? std::max<int64_t>(start, i - 29)
                               : (i < 50    ? -20
                                  : i < 100 ? 90
                                            : 400));
    }
  }
  return *Tensor::FromInts(first, {c.b, c.s}, DType::kInt32);
}

// The tensor-core forward (bf16 and fp16, head dims 64 and 128, sm_80+):
// several query and key tiles with ragged last ones, causal and not, GQA,
// packed documents with a window and key ranges that leave rows without a
// key, dropout; the kernel is the one FlashAttentionForward picks (checked
// on a GPU), bounds as flash_attention_test_util.h derives them for it.
TEST_F(CudaFlashAttentionTest, TensorCoreForwardMatchesTheCpuKernel) {
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16,
              f32 = DType::kFloat32;
  const std::vector<AttentionCase> cases = {
      {2, 300, 4, 2, 64, true, bf16, bf16, f32},
      {1, 257, 8, 2, 128, false, f16, f32, f32},
      {2, 150, 4, 1, 128, true, bf16, f32, f32, 0.1f},
      {1, 150, 2, 2, 64, false, bf16, bf16, f32},
  };
  uint32_t seed = 900;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const AttentionCase& c = cases[ci];
    SCOPED_TRACE(c.Name());
    AttentionOptions o = c.Options();
    if (ci >= 2) o.first_key = TensorCoreCaseFirstKeys(c);
    const flash_testing::HostInputs in = flash_testing::MakeInputs(c, seed++);
    flash_testing::Results want = flash_testing::EmptyResults(c, Device::CPU());
    flash_testing::Results got = flash_testing::EmptyResults(c, KernelDevice());
    const Tensor q = ToCuda(in.q), k = ToCuda(in.k), v = ToCuda(in.v);
    ExpectTensorCoresPicked(c, q, k, v, ToCuda(in.dout));
    ASSERT_TRUE(
        FlashAttentionForward(in.q, in.k, in.v, o, &want.out, &want.lse).ok());
    const absl::Status fwd =
        FlashAttentionForward(q, k, v, o, &got.out, &got.lse);
    ASSERT_TRUE(fwd.ok()) << fwd;
    const flash_testing::Bounds bd = flash_testing::AttentionBounds(
        c, in, want.out, want.lse, flash_testing::TensorCoreForward(c.dtype),
        o.first_key);
    EXPECT_TRUE(Near("out", ToHost(got.out), want.out, bd.out));
    const std::vector<double> gl = ToHost(got.lse).ToDoubles(),
                              wl = want.lse.ToDoubles();
    int64_t bad = 0;
    for (size_t i = 0; i < gl.size(); ++i) {
      const bool ok = std::isinf(wl[i]) ? std::isinf(gl[i]) && gl[i] < 0
                                        : std::fabs(gl[i] - wl[i]) <= bd.lse[i];
      bad += !ok;
    }
    EXPECT_EQ(bad, 0) << "lse rows out of bound";
  }
}

// The tensor-core backward (bf16 and fp16, head dims 64 and 128, sm_80+)
// given the CPU forward's out and lse: several key and query tiles with
// ragged last ones, causal and not, GQA, dO of q's type and fp32, packed
// documents with a window and key ranges that leave rows without a key,
// dropout; the kernels are the ones FlashAttentionBackward picks (checked
// on a GPU), bounds as flash_attention_test_util.h derives them for them,
// and a second run gives the same bits (no atomics).
TEST_F(CudaFlashAttentionTest, TensorCoreBackwardMatchesTheCpuKernel) {
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16,
              f32 = DType::kFloat32;
  const std::vector<AttentionCase> cases = {
      {2, 300, 4, 2, 64, true, bf16, bf16, f32},
      {1, 257, 8, 2, 128, false, f16, f32, f32},
      {2, 150, 4, 1, 128, true, bf16, bf16, bf16, 0.1f},
      {1, 150, 2, 2, 64, false, f16, f16, f16},
  };
  uint32_t seed = 950;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const AttentionCase& c = cases[ci];
    SCOPED_TRACE(c.Name());
    AttentionOptions o = c.Options();
    if (ci >= 2) o.first_key = TensorCoreCaseFirstKeys(c);
    const flash_testing::HostInputs in = flash_testing::MakeInputs(c, seed++);
    flash_testing::Results want = flash_testing::EmptyResults(c, Device::CPU());
    flash_testing::Results got = flash_testing::EmptyResults(c, KernelDevice());
    const Tensor q = ToCuda(in.q), k = ToCuda(in.k), v = ToCuda(in.v),
                 dout = ToCuda(in.dout);
    ExpectTensorCoresPicked(c, q, k, v, dout);
    ASSERT_TRUE(
        FlashAttentionForward(in.q, in.k, in.v, o, &want.out, &want.lse).ok());
    ASSERT_TRUE(FlashAttentionBackward(in.q, in.k, in.v, want.out, in.dout,
                                       want.lse, o, &want.dq, &want.dk,
                                       &want.dv)
                    .ok());
    const Tensor out = ToCuda(want.out), lse = ToCuda(want.lse);
    const absl::Status bwd = FlashAttentionBackward(q, k, v, out, dout, lse, o,
                                                    &got.dq, &got.dk, &got.dv);
    ASSERT_TRUE(bwd.ok()) << bwd;
    const flash_testing::Bounds bd = flash_testing::AttentionBounds(
        c, in, want.out, want.lse, flash_testing::TensorCoreForward(c.dtype),
        o.first_key, flash_testing::TensorCoreBackward(c.dtype, c.out_dtype));
    EXPECT_TRUE(Near("dq", ToHost(got.dq), want.dq, bd.dq));
    EXPECT_TRUE(Near("dk", ToHost(got.dk), want.dk, bd.dk));
    EXPECT_TRUE(Near("dv", ToHost(got.dv), want.dv, bd.dv));
    flash_testing::Results again =
        flash_testing::EmptyResults(c, KernelDevice());
    ASSERT_TRUE(FlashAttentionBackward(q, k, v, out, dout, lse, o, &again.dq,
                                       &again.dk, &again.dv)
                    .ok());
    EXPECT_TRUE(SameBytes(again.dq, got.dq));
    EXPECT_TRUE(SameBytes(again.dk, got.dk));
    EXPECT_TRUE(SameBytes(again.dv, got.dv));
  }
}

// A head dim above what the kernels take is an error naming the op, not a
// wrong result.
TEST_F(CudaFlashAttentionTest, RefusesHeadDimAbove256) {
  if (testing::OnTestDevice()) GTEST_SKIP() << "the CPU kernel takes it";
  const Tensor q =
      ToCuda(flash_testing::RandomTensor({1, 4, 1, 264}, DType::kFloat32, 1));
  Tensor out = Tensor::Empty(q.shape(), DType::kFloat32, KernelDevice());
  Tensor lse = Tensor::Empty({1, 1, 4}, DType::kFloat32, KernelDevice());
  const absl::Status st = FlashAttentionForward(q, q, q, {}, &out, &lse);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_NE(st.message().find("FlashAttentionForward"), std::string::npos);
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
