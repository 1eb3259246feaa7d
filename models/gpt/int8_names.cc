#include "models/gpt/int8_names.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mcc {
namespace gpt {

bool IsInt8QuantizedWeightName(absl::string_view name) {
  if (!absl::StartsWith(name, "decoder.layers.")) return false;
  for (const char* suffix :
       {".self_attention.linear_qkv.weight",
        ".self_attention.linear_proj.weight", ".mlp.linear_fc1.weight",
        ".mlp.linear_fc2.weight"}) {
    if (absl::EndsWith(name, suffix)) return true;
  }
  return false;
}

std::string Int8ScaleName(absl::string_view weight_name) {
  return absl::StrCat(weight_name, "_scale");
}

}  // namespace gpt
}  // namespace mcc
