#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "inference/serve_config.pb.h"
#include "tools/flags/eval_config_from_flags.h"
#include "tools/flags/eval_flags.h"
#include "tools/flags/serve_flags.h"
#include "tools/flags/training_flags.h"

namespace mcc {
namespace flags {
namespace {

using google::protobuf::FieldDescriptor;

// A field's default as Abseil would print its flag's.
std::string FieldDefault(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return std::to_string(field->default_value_int32());
    case FieldDescriptor::CPPTYPE_INT64:
      return std::to_string(field->default_value_int64());
    case FieldDescriptor::CPPTYPE_BOOL:
      return field->default_value_bool() ? "true" : "false";
    case FieldDescriptor::CPPTYPE_STRING:
      return field->default_value_string();
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      // Abseil prints doubles with the shortest exact digits.
      return absl::UnparseFlag(field->default_value_double());
    }
    default:
      return "?";
  }
}

// Every field of `d` but the TrainConfig ("run") and --quantize (whose
// library this test does not link) is the flag of its name, with the flag's
// default; returns how many were checked.
int CheckFieldsAreFlags(const google::protobuf::Descriptor* d) {
  int checked = 0;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* field = d->field(i);
    if (field->name() == "run" || field->name() == "quantize") continue;
    const absl::CommandLineFlag* flag =
        absl::FindCommandLineFlag(field->name());
    if (flag == nullptr) {
      ADD_FAILURE() << d->name() << "." << field->name()
                    << " has no flag of its name";
      continue;
    }
    EXPECT_EQ(flag->DefaultValue(), FieldDefault(field))
        << d->name() << "." << field->name();
    ++checked;
  }
  return checked;
}

TEST(EvalConfigFromFlagsTest, FieldsAreEvalsFlagsWithTheirDefaults) {
  EXPECT_EQ(CheckFieldsAreFlags(training::EvalConfig::descriptor()), 8);
}

TEST(ServeConfigTest, FieldsAreServesFlagsWithTheirDefaults) {
  EXPECT_EQ(CheckFieldsAreFlags(inference::ServeConfig::descriptor()), 22);
}

// In the TrainConfig a field is present exactly when its flag was given.
TEST(EvalConfigFromFlagsTest, RunHoldsOnlyTheGivenFlags) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_num_layers, 6);
  absl::SetFlag(&FLAGS_prompt, std::string("Hello"));
  absl::SetFlag(&FLAGS_top_k, 5);
  // Given with its default value: still present.
  auto config = EvalConfigFromFlags({"num_layers", "eval_iters", "prompt"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->run().has_num_layers());
  EXPECT_EQ(config->run().num_layers(), 6);
  EXPECT_TRUE(config->run().has_eval_iters());
  EXPECT_EQ(config->run().eval_iters(), absl::GetFlag(FLAGS_eval_iters));
  EXPECT_FALSE(config->run().has_hidden_size());
  EXPECT_FALSE(config->run().has_bf16());
  // Not given, yet defaults agree with the flags.
  EXPECT_EQ(config->run().hidden_size(), absl::GetFlag(FLAGS_hidden_size));
  EXPECT_EQ(config->prompt(), "Hello");
  EXPECT_EQ(config->top_k(), 5);

  // A flag changed but not named (set by a preset, say) counts as given.
  absl::SetFlag(&FLAGS_hidden_size, 96);
  config = EvalConfigFromFlags({});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->run().has_hidden_size());
  EXPECT_EQ(config->run().hidden_size(), 96);
  EXPECT_FALSE(config->run().has_eval_iters());
}

}  // namespace
}  // namespace flags
}  // namespace mcc
