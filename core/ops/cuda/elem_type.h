// The element types that the CUDA kernel launchers of //core/ops/cuda:kernels
// take beside each untyped pointer. Kernels load every float type as fp32 and
// store fp32 results rounded to the output's type, so one compiled kernel
// serves every mix of input and output dtypes that the CPU ops accept. The
// values match mcc::DType's order for the registrations' mapping; this header
// is plain C++ so that .cu files need not include core/dtype.h.
#ifndef CORE_OPS_CUDA_ELEM_TYPE_H_
#define CORE_OPS_CUDA_ELEM_TYPE_H_

#include <cstdint>

namespace mcc {
namespace cuda_kernels {

enum class ElemType : int32_t {
  kF32 = 0,   // IEEE binary32
  kBF16 = 1,  // bfloat16 bits
  kF16 = 2,   // IEEE binary16 bits
  kI32 = 3,
  kI64 = 4,
  kI8 = 5,  // quantised weights (core/ops/int8_gemm.h)
};

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_ELEM_TYPE_H_
