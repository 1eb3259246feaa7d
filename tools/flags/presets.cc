#include "tools/flags/presets.h"

#include <utility>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"

namespace mcc {
namespace flags {

absl::Status ApplyPreset(const std::string& name,
                         const std::set<std::string>& explicitly_set,
                         bool skip_undefined) {
  if (name.empty()) return absl::OkStatus();
  std::vector<std::pair<std::string, std::string>> values;
  if (name == "bench") {
    values = {{"num_layers", "6"},
              {"hidden_size", "512"},
              {"num_attention_heads", "8"},
              {"vocab_size", "8192"},
              {"seq_length", "512"},
              {"micro_batch_size", "4"},
              {"mock_data", "true"},
              {"train_iters", "20"},
              {"log_interval", "5"},
              {"eval_iters", "0"},
              {"make_vocab_size_divisible_by", "1"}};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--preset: unknown preset '", name, "' (known: bench)"));
  }
  for (const auto& [flag_name, value] : values) {
    if (explicitly_set.count(flag_name)) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(flag_name);
    if (flag == nullptr && skip_undefined) continue;
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      return absl::InternalError(
          absl::StrCat("preset sets --", flag_name, ": ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace flags
}  // namespace mcc
