#include "tools/flags/message_from_flags.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"

namespace mcc {
namespace flags {
namespace {

using google::protobuf::FieldDescriptor;

absl::Status BadValue(const std::string& message, const std::string& flag,
                      const std::string& value, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", value,
                                                 "' is not ", what, " (",
                                                 message, ".", flag, ")"));
}

// Sets `field` of `message` from a flag's value as Abseil prints it.
absl::Status SetField(const FieldDescriptor* field, const std::string& value,
                      google::protobuf::Message* message) {
  const google::protobuf::Reflection* r = message->GetReflection();
  const std::string& name = field->name();
  const std::string& type = message->GetDescriptor()->name();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      int64_t v = 0;
      if (!absl::SimpleAtoi(value, &v) ||
          v < std::numeric_limits<int32_t>::min() ||
          v > std::numeric_limits<int32_t>::max()) {
        return BadValue(type, name, value, "a 32-bit integer");
      }
      r->SetInt32(message, field, static_cast<int32_t>(v));
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) {
        return BadValue(type, name, value, "a 64-bit integer");
      }
      r->SetInt64(message, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double v = 0;
      if (!absl::SimpleAtod(value, &v))
        return BadValue(type, name, value, "a number");
      r->SetDouble(message, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool v = false;
      if (!absl::SimpleAtob(value, &v)) {
        return BadValue(type, name, value, "true or false");
      }
      r->SetBool(message, field, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(message, field, value);
      return absl::OkStatus();
    default:
      return absl::InternalError(
          absl::StrCat(type, ".", name, " has a type no flag has"));
  }
}

}  // namespace

absl::Status FieldsFromFlags(google::protobuf::Message* message) {
  const google::protobuf::Descriptor* d = message->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* field = d->field(i);
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE ||
        field->is_repeated()) {
      continue;
    }
    const absl::CommandLineFlag* flag =
        absl::FindCommandLineFlag(field->name());
    if (flag == nullptr) continue;
    absl::Status s = SetField(field, flag->CurrentValue(), message);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace flags
}  // namespace mcc
