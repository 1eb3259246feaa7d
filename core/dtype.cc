#include "core/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mcc {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kInt64:
      return 8;
    case DType::kInt8:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kInt8:
      return "int8";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "fp32" || name == "float32" || name == "float") {
    return DType::kFloat32;
  }
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "half") {
    return DType::kFloat16;
  }
  if (name == "int32") return DType::kInt32;
  if (name == "int64") return DType::kInt64;
  if (name == "int8") return DType::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "' (expected fp32, bf16, fp16, int32, int64 or int8)"));
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat16;
}

}  // namespace mcc
