#include "tools/flags/eval_config_from_flags.h"

#include <vector>

#include "google/protobuf/descriptor.h"
#include "tools/flags/megatron_args.h"
#include "tools/flags/message_from_flags.h"

namespace mcc {
namespace flags {

absl::StatusOr<training::EvalConfig> EvalConfigFromFlags(
    const std::set<std::string>& explicitly_set) {
  training::EvalConfig config;
  if (absl::Status s = FieldsFromFlags(&config); !s.ok()) return s;
  training::TrainConfig* run = config.mutable_run();
  if (absl::Status s = FieldsFromFlags(run); !s.ok()) return s;
  const google::protobuf::Descriptor* d = run->GetDescriptor();
  const google::protobuf::Reflection* r = run->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = d->field(i);
    if (!FlagGiven(field->name(), explicitly_set)) r->ClearField(run, field);
  }
  return config;
}

}  // namespace flags
}  // namespace mcc
