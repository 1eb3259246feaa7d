#include <cstdint>

#include "core/ops/cuda/flash_attention.h"
#include "core/ops/cuda/kernel_util.cuh"

namespace mcc {
namespace cuda_kernels {
namespace flash {

__device__ __forceinline__ float* SharedFloats() {
  extern __shared__ float4 flash_shared[];
  return reinterpret_cast<float*>(flash_shared);
}

}  // namespace flash
}  // namespace cuda_kernels
}  // namespace mcc

#include "core/ops/cuda/flash_attention_kernels.cuh"
#include "core/ops/cuda/flash_attention_mma_backward_kernels.cuh"
#include "core/ops/cuda/flash_attention_mma_kernels.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

dim3 Dim(flash::Grid g) { return dim3(g.x, g.y, g.z); }

// Raises the kernel's dynamic shared-memory limit to `bytes` (above the
// default 48 KiB) and launches it.
template <typename Kernel>
cudaError_t Launch(Kernel kernel, flash::Grid grid, size_t bytes,
                   const flash::Params& p, cudaStream_t stream) {
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
  if (e != cudaSuccess) return e;
  kernel<<<Dim(grid), flash::kThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

template <int kD>
cudaError_t Forward(const flash::Params& p, cudaStream_t stream) {
  return Launch(flash::ForwardKernel<kD>, flash::ForwardGrid<kD>(p),
                flash::Smem<kD>::kForward, p, stream);
}

// Launch with the tensor-core kernels' block of kMmaThreads.
template <typename Kernel>
cudaError_t LaunchMma(Kernel kernel, flash::Grid grid, size_t bytes,
                      const flash::Params& p, cudaStream_t stream) {
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
  if (e != cudaSuccess) return e;
  kernel<<<Dim(grid), flash::kMmaThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

template <int kD, mma::Input kIn>
cudaError_t MmaForward(const flash::Params& p, cudaStream_t stream) {
  return LaunchMma(flash::MmaForwardKernel<kD, kIn>,
                   flash::MmaForwardGrid<kD>(p), flash::MmaSmem<kD>::kForward,
                   p, stream);
}

template <int kD>
cudaError_t MmaForwardOf(const flash::Params& p, cudaStream_t stream) {
  return p.qt == ElemType::kBF16 ? MmaForward<kD, mma::Input::kBF16>(p, stream)
                                 : MmaForward<kD, mma::Input::kF16>(p, stream);
}

cudaError_t RowDot(const flash::Params& p, cudaStream_t stream) {
  flash::
      RowDotKernel<<<Dim(flash::RowDotGrid(p)), flash::kThreads, 0, stream>>>(
          p);
  return cudaGetLastError();
}

template <int kD, mma::Input kIn>
cudaError_t MmaBackward(const flash::Params& p, cudaStream_t stream) {
  cudaError_t e = RowDot(p, stream);
  if (e != cudaSuccess) return e;
  e = LaunchMma(flash::MmaKvGradKernel<kD, kIn>, flash::MmaKvGradGrid<kD>(p),
                flash::MmaBackwardSmem<kD>::kKvGrad, p, stream);
  if (e != cudaSuccess) return e;
  return LaunchMma(flash::MmaQGradKernel<kD, kIn>, flash::MmaQGradGrid<kD>(p),
                   flash::MmaBackwardSmem<kD>::kQGrad, p, stream);
}

template <int kD>
cudaError_t MmaBackwardOf(const flash::Params& p, cudaStream_t stream) {
  return p.qt == ElemType::kBF16 ? MmaBackward<kD, mma::Input::kBF16>(p, stream)
                                 : MmaBackward<kD, mma::Input::kF16>(p, stream);
}

// FlashAttentionSharedBytes reports the SIMT kernels' needs: the tensor-core
// kernels' must not exceed them.
static_assert(flash::MmaSmem<64>::kForward <= flash::Smem<64>::kForward &&
                  flash::MmaSmem<128>::kForward <= flash::Smem<128>::kForward &&
                  flash::MmaBackwardSmem<64>::kKvGrad <=
                      flash::Smem<64>::kKvGrad &&
                  flash::MmaBackwardSmem<128>::kKvGrad <=
                      flash::Smem<128>::kKvGrad,
              "a tensor-core kernel needs more shared memory than the SIMT "
              "kernels of its head dim");

bool Aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

template <int kD>
cudaError_t Backward(const flash::Params& p, cudaStream_t stream) {
  cudaError_t e = RowDot(p, stream);
  if (e != cudaSuccess) return e;
  e = Launch(flash::KvGradKernel<kD>, flash::KvGradGrid<kD>(p),
             flash::Smem<kD>::kKvGrad, p, stream);
  if (e != cudaSuccess) return e;
  return Launch(flash::QGradKernel<kD>, flash::QGradGrid<kD>(p),
                flash::Smem<kD>::kQGrad, p, stream);
}

}  // namespace

size_t FlashAttentionSharedBytes(int64_t head_dim) {
  auto largest = [](size_t a, size_t b, size_t c) {
    return a > b ? (a > c ? a : c) : (b > c ? b : c);
  };
  switch (flash::PaddedHeadDim(head_dim)) {
    case 64:
      return largest(flash::Smem<64>::kForward, flash::Smem<64>::kKvGrad,
                     flash::Smem<64>::kQGrad);
    case 128:
      return largest(flash::Smem<128>::kForward, flash::Smem<128>::kKvGrad,
                     flash::Smem<128>::kQGrad);
    case 256:
      return largest(flash::Smem<256>::kForward, flash::Smem<256>::kKvGrad,
                     flash::Smem<256>::kQGrad);
    default:
      return 0;
  }
}

FlashKernel FlashAttentionForwardKernelFor(const FlashAttentionArgs& args,
                                           const void* q, const void* k,
                                           const void* v, ElemType qt) {
  if (!args.tensor_cores || (qt != ElemType::kBF16 && qt != ElemType::kF16)) {
    return FlashKernel::kSimt;
  }
  if (args.head_dim != 64 && args.head_dim != 128) {
    return FlashKernel::kSimt;
  }
  // The tiles are read in 16-byte pieces.
  if (!Aligned16(q) || !Aligned16(k) || !Aligned16(v)) {
    return FlashKernel::kSimt;
  }
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                             device) != cudaSuccess) {
    (void)cudaGetLastError();  // Leave no sticky error: the SIMT kernel runs.
    return FlashKernel::kSimt;
  }
  return major >= 8 ? FlashKernel::kTensorCore : FlashKernel::kSimt;
}

FlashKernel FlashAttentionBackwardKernelFor(const FlashAttentionArgs& args,
                                            const void* q, const void* k,
                                            const void* v, const void* dout,
                                            ElemType qt) {
  // dO's tiles are read in 16-byte pieces when it is q's type.
  if (!Aligned16(dout)) return FlashKernel::kSimt;
  return FlashAttentionForwardKernelFor(args, q, k, v, qt);
}

cudaError_t FlashAttentionForward(const FlashAttentionArgs& args, const void* q,
                                  const void* k, const void* v, ElemType qt,
                                  void* out, ElemType ot, float* lse,
                                  cudaStream_t stream) {
  if (args.batch * args.seq * args.heads * args.head_dim == 0) {
    return cudaSuccess;
  }
  flash::Params p = flash::ParamsOf(args);
  p.q = q;
  p.k = k;
  p.v = v;
  p.qt = qt;
  p.out = out;
  p.ot = ot;
  p.lse = lse;
  if (FlashAttentionForwardKernelFor(args, q, k, v, qt) ==
      FlashKernel::kTensorCore) {
    return args.head_dim == 64 ? MmaForwardOf<64>(p, stream)
                               : MmaForwardOf<128>(p, stream);
  }
  switch (flash::PaddedHeadDim(args.head_dim)) {
    case 64:
      return Forward<64>(p, stream);
    case 128:
      return Forward<128>(p, stream);
    case 256:
      return Forward<256>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t FlashAttentionBackward(const FlashAttentionArgs& args,
                                   const void* q, const void* k, const void* v,
                                   ElemType qt, const void* out,
                                   const void* dout, ElemType ot,
                                   const float* lse, void* dq, ElemType dqt,
                                   void* dk, void* dv, ElemType dkt,
                                   float* row_dot, cudaStream_t stream) {
  if (args.batch * args.seq * args.heads * args.head_dim == 0) {
    return cudaSuccess;
  }
  flash::Params p = flash::ParamsOf(args);
  p.q = q;
  p.k = k;
  p.v = v;
  p.qt = qt;
  p.out = const_cast<void*>(out);
  p.dout = dout;
  p.ot = ot;
  p.lse = const_cast<float*>(lse);
  p.drow = row_dot;
  p.dq = dq;
  p.dqt = dqt;
  p.dk = dk;
  p.dv = dv;
  p.dkt = dkt;
  if (FlashAttentionBackwardKernelFor(args, q, k, v, dout, qt) ==
      FlashKernel::kTensorCore) {
    return args.head_dim == 64 ? MmaBackwardOf<64>(p, stream)
                               : MmaBackwardOf<128>(p, stream);
  }
  switch (flash::PaddedHeadDim(args.head_dim)) {
    case 64:
      return Backward<64>(p, stream);
    case 128:
      return Backward<128>(p, stream);
    case 256:
      return Backward<256>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda_kernels
}  // namespace mcc
