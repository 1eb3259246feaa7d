#include "core/device.h"

#include "absl/strings/str_cat.h"

namespace mcc {

std::string Device::ToString() const {
  if (is_cpu()) return "cpu";
  return absl::StrCat("cuda:", index);
}

}  // namespace mcc
