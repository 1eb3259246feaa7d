#ifndef CORE_DTYPE_H_
#define CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {

// Element types a Tensor can hold. The numeric values are stable: checkpoint
// metadata stores them.
enum class DType : int32_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  // Quantised weights (core/ops/int8_gemm.h); converts like the integers.
  kInt8 = 5,
};

size_t DTypeSize(DType dtype);
absl::string_view DTypeName(DType dtype);  // "fp32", "bf16", ...
absl::StatusOr<DType> ParseDType(absl::string_view name);
bool IsFloatingPoint(DType dtype);

}  // namespace mcc

#endif  // CORE_DTYPE_H_
