#include "tools/flags/megatron_args.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
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
  std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
  int flagfiles_read = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--help" || arg == "-h" || arg == "--helpfull") {
      parsed.positional.push_back("help");  // The binary prints its usage.
      continue;
    }
    if (arg == "--") {
      for (++i; i < args.size(); ++i) parsed.positional.push_back(args[i]);
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
    // Abseil's own parser flags are registered but only its parser reads
    // them; --flagfile is read here, the others would be silently ignored.
    if (name == "fromenv" || name == "tryfromenv" || name == "undefok") {
      return absl::InvalidArgumentError(
          absl::StrCat("--", body,
                       " is not supported here; put flags in --flagfile "
                       "FILE or --config FILE instead"));
    }
    if (name == "flagfile") {
      if (!has_value) {
        if (i + 1 >= args.size()) {
          return absl::InvalidArgumentError("flag --flagfile needs a value");
        }
        value = args[++i];
      }
      if (++flagfiles_read > 100) {
        return absl::InvalidArgumentError(
            "--flagfile: more than 100 files (does one include itself?)");
      }
      // Each file's words (one flag a line, as Abseil's --flagfile; '#'
      // starts a comment line) come next, before the rest of the line.
      std::vector<std::string> words;
      for (absl::string_view file : absl::StrSplit(value, ',')) {
        std::ifstream in{std::string(file)};
        if (!in) {
          return absl::InvalidArgumentError(
              absl::StrCat("--flagfile: cannot read '", file, "'"));
        }
        std::string line;
        while (std::getline(in, line)) {
          absl::string_view word = absl::StripAsciiWhitespace(line);
          if (word.empty() || word[0] == '#') continue;
          words.emplace_back(word);
        }
      }
      args.insert(args.begin() + i + 1, words.begin(), words.end());
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    // --noflag (Abseil) or --no-flag (Megatron's argparse) for booleans.
    for (size_t prefix : {3, 2}) {
      if (flag != nullptr || has_value ||
          !absl::StartsWith(name, prefix == 3 ? "no_" : "no")) {
        continue;
      }
      absl::CommandLineFlag* base =
          absl::FindCommandLineFlag(name.substr(prefix));
      if (base != nullptr && base->IsOfType<bool>()) {
        flag = base;
        name = name.substr(prefix);
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
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", Dashed(name), " needs a value"));
      }
      value = args[++i];
      if (multi_word.count(name)) {
        // Take words until the next flag.
        while (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
          absl::StrAppend(&value, " ", args[++i]);
        }
      }
    }
    if (absl::Status s = SetFlag(flag, name, value); !s.ok()) return s;
    parsed.explicitly_set.insert(name);
  }
  return parsed;
}

bool FlagGiven(const std::string& name,
               const std::set<std::string>& explicitly_set) {
  if (explicitly_set.count(name)) return true;
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && flag->CurrentValue() != flag->DefaultValue();
}

absl::Status RefuseUnusedFlags(const std::vector<UnusedFlag>& rules,
                               const std::set<std::string>& explicitly_set) {
  for (const UnusedFlag& rule : rules) {
    if (rule.unused && FlagGiven(rule.flag, explicitly_set)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", Dashed(rule.flag), ": ", rule.why));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> UnusedFlagWarnings(
    const std::vector<UnusedFlag>& rules,
    const std::set<std::string>& explicitly_set) {
  std::vector<std::string> lines;
  for (const UnusedFlag& rule : rules) {
    if (rule.unused && FlagGiven(rule.flag, explicitly_set)) {
      lines.push_back(absl::StrCat("--", Dashed(rule.flag),
                                   " has no effect in this run: ", rule.why));
    }
  }
  return lines;
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
  return ApplyConfigText(text.str(), path, prototype, explicitly_set);
}

absl::Status ApplyConfigText(const std::string& text, const std::string& path,
                             const google::protobuf::Message& prototype,
                             const std::set<std::string>& explicitly_set) {
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
  if (!parser.ParseFromString(text, config.get())) {
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

std::string Usage() {
  std::vector<std::string> lines;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    lines.push_back(absl::StrCat("  --", Dashed(name), " (default ",
                                 flag->DefaultValue(), "): ", flag->Help()));
  }
  std::sort(lines.begin(), lines.end());
  return absl::StrJoin(lines, "\n");
}

}  // namespace flags
}  // namespace mcc
