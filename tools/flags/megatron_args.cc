#include "tools/flags/megatron_args.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace mcc {
namespace flags {
namespace {

std::string Underscored(absl::string_view name) {
  return absl::StrReplaceAll(name, {{"-", "_"}});
}

std::string Dashed(absl::string_view name) {
  return absl::StrReplaceAll(name, {{"_", "-"}});
}

absl::Status SetFlag(absl::CommandLineFlag* flag, const std::string& name,
                     const std::string& value) {
  std::string error;
  if (!flag->ParseFrom(value, &error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad value '", value, "' for --", Dashed(name), ": ", error));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedArgs> ParseMegatronArgs(
    int argc, char** argv, const std::set<std::string>& multi_word) {
  ParsedArgs parsed;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "--helpfull") {
      parsed.positional.push_back("help");  // The binary prints its usage.
      continue;
    }
    if (arg == "--") {
      for (++i; i < argc; ++i) parsed.positional.push_back(argv[i]);
      break;
    }
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      if (absl::StartsWith(arg, "-") && arg.size() > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown option '", arg, "' (flags start with --)"));
      }
      parsed.positional.push_back(arg);
      continue;
    }
    std::string body = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
      has_value = true;
    }
    std::string name = Underscored(body);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* base = absl::FindCommandLineFlag(name.substr(2));
      if (base != nullptr && base->IsOfType<bool>() && !has_value) {
        flag = base;
        name = name.substr(2);
        negated = true;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", body, " (see --help)"));
    }
    if (flag->IsOfType<bool>()) {
      if (!has_value) value = negated ? "false" : "true";
    } else if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", Dashed(name), " needs a value"));
      }
      value = argv[++i];
      if (multi_word.count(name)) {
        // Take words until the next flag.
        while (i + 1 < argc && !absl::StartsWith(argv[i + 1], "--")) {
          absl::StrAppend(&value, " ", argv[++i]);
        }
      }
    }
    if (absl::Status s = SetFlag(flag, name, value); !s.ok()) return s;
    parsed.explicitly_set.insert(name);
  }
  return parsed;
}

absl::Status ApplyConfigFile(const std::string& path,
                             const google::protobuf::Message& prototype,
                             const std::set<std::string>& explicitly_set) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--config: cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  std::unique_ptr<google::protobuf::Message> config(prototype.New());
  // Collect parse errors instead of printing them.
  class Collector : public google::protobuf::io::ErrorCollector {
   public:
    void AddError(int line, int column, const std::string& message) override {
      if (first.empty()) {
        first = absl::StrCat("line ", line + 1, " column ", column + 1, ": ",
                             message);
      }
    }
    std::string first;
  } errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), config.get())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config ", path, ": ", errors.first));
  }
  const google::protobuf::Reflection* reflection = config->GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(*config, &fields);
  for (const auto* field : fields) {
    const std::string& name = field->name();
    if (explicitly_set.count(name)) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--config ", path, ": field '", name, "' matches no flag"));
    }
    std::string value;
    if (field->cpp_type() ==
        google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
      value = reflection->GetString(*config, field);
    } else {
      google::protobuf::TextFormat::PrintFieldValueToString(*config, field, -1,
                                                            &value);
    }
    if (absl::Status s = SetFlag(flag, name, value); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config ", path, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string Usage(const std::string& path_prefix) {
  std::vector<std::string> lines;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::StrContains(flag->Filename(), path_prefix)) continue;
    lines.push_back(absl::StrCat("  --", Dashed(name), " (default ",
                                 flag->DefaultValue(), "): ", flag->Help()));
  }
  std::sort(lines.begin(), lines.end());
  return absl::StrJoin(lines, "\n");
}

}  // namespace flags
}  // namespace mcc
