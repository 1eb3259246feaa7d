// Fuzzes the text-format --config file (ApplyConfigText with TrainConfig)
// and, after a kPartSeparator, a Megatron-style command line, one word a
// line (ParseMegatronArgs). The binary's flags are stood in for by a few of
// each type; fields without one are errors. Any text gives a status whose
// message names the file (config) or nothing crashes (command line).

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/testing/fuzz/fuzz_input.h"
#include "glog/logging.h"
#include "tools/flags/megatron_args.h"
#include "training/train_config.pb.h"

ABSL_FLAG(int32_t, num_layers, 2, "stand-in");
ABSL_FLAG(int64_t, hidden_size, 64, "stand-in");
ABSL_FLAG(double, lr, 1e-4, "stand-in");
ABSL_FLAG(bool, bf16, false, "stand-in");
ABSL_FLAG(std::string, data_path, "", "stand-in");
ABSL_FLAG(std::string, tokenizer_type, "", "stand-in");
ABSL_FLAG(std::string, split, "969,30,1", "stand-in");
ABSL_FLAG(int32_t, seed, 1234, "stand-in");
ABSL_FLAG(int64_t, train_iters, 0, "stand-in");

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = mcc::fuzz::SplitParts(data, size, 2);
  const std::set<std::string> explicitly_set = {"seed"};
  absl::Status s = mcc::flags::ApplyConfigText(
      parts[0], "run.cfg", mcc::training::TrainConfig(), explicitly_set);
  if (!s.ok()) {
    CHECK(absl::string_view(s.message()).find("run.cfg") !=
          absl::string_view::npos)
        << s;
  }
  std::vector<std::string> words = absl::StrSplit(parts[1], '\n');
  words.insert(words.begin(), "train");
  std::vector<char*> argv;
  for (std::string& w : words) {
    // --flagfile reads files of its own; that is not this input.
    if (absl::string_view(w).find("flagfile") != absl::string_view::npos) {
      continue;
    }
    argv.push_back(w.data());
  }
  mcc::flags::ParseMegatronArgs(static_cast<int>(argv.size()), argv.data(),
                                {"data_path"})
      .status()
      .IgnoreError();
  return 0;
}
