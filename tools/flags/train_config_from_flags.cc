#include "tools/flags/train_config_from_flags.h"

#include "tools/flags/message_from_flags.h"

namespace mcc {
namespace flags {

absl::StatusOr<training::TrainConfig> TrainConfigFromFlags() {
  training::TrainConfig config;
  if (absl::Status s = FieldsFromFlags(&config); !s.ok()) return s;
  return config;
}

}  // namespace flags
}  // namespace mcc
