#include "core/device.h"

#include "absl/strings/str_cat.h"

namespace mcc {

std::string Device::ToString() const {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kCUDA:
      return absl::StrCat("cuda:", index);
    case DeviceType::kTestDevice:
      return absl::StrCat("testdev:", index);
  }
  return absl::StrCat("device", static_cast<int>(type), ":", index);
}

}  // namespace mcc
