#ifndef TOOLS_FLAGS_MESSAGE_FROM_FLAGS_H_
#define TOOLS_FLAGS_MESSAGE_FROM_FLAGS_H_

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace mcc {
namespace flags {

// Sets every scalar field of `message` whose name is a flag this binary
// registers to the flag's current value (so --config, presets and defaults
// all arrive as the flags hold them); other fields are left alone. Errors
// name the flag whose value does not fit its field, and the field.
absl::Status FieldsFromFlags(google::protobuf::Message* message);

}  // namespace flags
}  // namespace mcc

#endif  // TOOLS_FLAGS_MESSAGE_FROM_FLAGS_H_
