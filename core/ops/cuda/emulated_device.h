// What the kernels' .cuh files expect from their includer (see
// flash_attention_kernels.cuh), for running them on the host emulator
// (cuda_emulator.h) in tests: kernel_util.cuh's typed loads and stores with
// core/half.h's conversions (which kernel_util.cuh matches bit for bit), and
// the block's shared memory. Include after every other header and before
// the kernels' .cuh. Test-only.
#ifndef CORE_OPS_CUDA_EMULATED_DEVICE_H_
#define CORE_OPS_CUDA_EMULATED_DEVICE_H_

#include <cstdint>

#include "core/half.h"
#include "core/ops/cuda/elem_type.h"
// Last: it defines CUDA's keywords as macros.
#include "core/ops/cuda/cuda_emulator.h"

namespace mcc {
namespace cuda_kernels {
namespace internal {

inline float LoadAs(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kBF16:
      return BFloat16ToFloat(static_cast<const BFloat16*>(p)[i]);
    case ElemType::kF16:
      return Float16ToFloat(static_cast<const Float16*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

inline void StoreAs(void* p, ElemType t, int64_t i, float v) {
  switch (t) {
    case ElemType::kBF16:
      static_cast<BFloat16*>(p)[i] = FloatToBFloat16(v);
      break;
    case ElemType::kF16:
      static_cast<Float16*>(p)[i] = FloatToFloat16(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

}  // namespace internal

namespace flash {
inline float* SharedFloats() {
  return ::mcc::cuda_emu::Emulator::Current().shared();
}
}  // namespace flash

namespace cached {
inline float* SharedFloats() {
  return ::mcc::cuda_emu::Emulator::Current().shared();
}
}  // namespace cached

namespace paged {
inline float* SharedFloats() {
  return ::mcc::cuda_emu::Emulator::Current().shared();
}
}  // namespace paged

namespace moe {
inline float* SharedFloats() {
  return ::mcc::cuda_emu::Emulator::Current().shared();
}
}  // namespace moe

namespace fp8w {
inline float* SharedFloats() {
  return ::mcc::cuda_emu::Emulator::Current().shared();
}
}  // namespace fp8w

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_EMULATED_DEVICE_H_
