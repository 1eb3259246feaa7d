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
// --help (or -h) comes back as the positional word "help". Every flag must
// be known; any error names the flag and comes back as a
// status (binaries print it on one line and exit with code 2).
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

// One line per flag defined in files under `path_prefix` (e.g. "tools/"),
// with the dashed name and help, for --help.
std::string Usage(const std::string& path_prefix);

}  // namespace flags
}  // namespace mcc

#endif  // TOOLS_FLAGS_MEGATRON_ARGS_H_
