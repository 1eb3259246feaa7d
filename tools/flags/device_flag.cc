#include "tools/flags/device_flag.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, device, "auto",
          "Where the model, optimizer state, batches and loss live: cpu, "
          "cuda (the GPU LOCAL_RANK picks: cuda:LOCAL_RANK % device count) "
          "or auto (cuda when a GPU is present, else cpu).");
