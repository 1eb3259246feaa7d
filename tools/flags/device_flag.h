#ifndef TOOLS_FLAGS_DEVICE_FLAG_H_
#define TOOLS_FLAGS_DEVICE_FLAG_H_

// --device, for train and eval (what it means: training/device_choice.h).

#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, device);

#endif  // TOOLS_FLAGS_DEVICE_FLAG_H_
