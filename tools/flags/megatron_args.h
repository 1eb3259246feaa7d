#ifndef TOOLS_FLAGS_MEGATRON_ARGS_H_
#define TOOLS_FLAGS_MEGATRON_ARGS_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace mcc {
namespace flags {

// Command lines as Megatron-LM users write them, parsed onto Abseil flags:
//   --num-layers 4, --num-layers=4, --num_layers 4    (dashes or underscores)
//   --bf16, --bf16=false, --nobf16                     (booleans)
//   --data-path 0.3 prefixA 0.7 prefixB                (several words: flags
//                                                      named in multi_word)
//   --flagfile FILE[,FILE]                             (one flag a line)
// --help, --helpfull (or -h) come back as the positional word "help". Every
// flag must be known; Abseil's --fromenv, --tryfromenv and --undefok are
// refused. Any error names the flag and comes back as a status (binaries
// print it on one line and exit with code 2).
struct ParsedArgs {
  std::vector<std::string> positional;
  std::set<std::string> explicitly_set;  // flag names, underscored
};

absl::StatusOr<ParsedArgs> ParseMegatronArgs(
    int argc, char** argv, const std::set<std::string>& multi_word = {});

// Applies a text-format protobuf config (--config FILE): every field that is
// set in the file sets the Abseil flag of the same name, unless the command
// line set it (flags override the file). `prototype` is the config message
// type (e.g. TrainConfig); unknown fields or a field without a flag are
// errors naming the file.
absl::Status ApplyConfigFile(const std::string& path,
                             const google::protobuf::Message& prototype,
                             const std::set<std::string>& explicitly_set);
// The same for the file's text; path only names it in errors.
absl::Status ApplyConfigText(const std::string& text, const std::string& path,
                             const google::protobuf::Message& prototype,
                             const std::set<std::string>& explicitly_set);

// A flag that this run cannot use (`unused`), and why, in words that tell
// the user what would make it matter.
struct UnusedFlag {
  std::string flag;  // Underscored name.
  bool unused = false;
  std::string why;
};

// Whether the flag was given: set on the command line, or (by --config, a
// preset or --flagfile) changed from its default.
bool FlagGiven(const std::string& name,
               const std::set<std::string>& explicitly_set);

// The first rule whose flag was given but is unused, as an error naming it:
// for flags the binary never reads.
absl::Status RefuseUnusedFlags(const std::vector<UnusedFlag>& rules,
                               const std::set<std::string>& explicitly_set);

// One warning line per given, unused flag: for flags that matter only in
// other modes of the binary (Megatron ignores those silently).
std::vector<std::string> UnusedFlagWarnings(
    const std::vector<UnusedFlag>& rules,
    const std::set<std::string>& explicitly_set);

// One line per registered flag (every one ParseMegatronArgs accepts), with
// the dashed name, default and help, for --help; tests enumerate the
// binaries' flags from it.
std::string Usage();

}  // namespace flags
}  // namespace mcc

#endif  // TOOLS_FLAGS_MEGATRON_ARGS_H_
