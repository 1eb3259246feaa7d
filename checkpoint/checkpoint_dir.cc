#include "checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/file_util.h"

namespace mcc {

std::string IterationDirName(int64_t iteration) {
  return absl::StrFormat("iter_%07d", iteration);
}

std::string ShardFileName(int rank) {
  return absl::StrFormat("shard_r%05d.bin", rank);
}

absl::StatusOr<int64_t> LatestIteration(const std::string& dir) {
  const std::string path = file_util::JoinPath(dir, kLatestFileName);
  auto text = file_util::ReadFileToString(path);
  if (!text.ok()) return text.status();
  int64_t it = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &it) || it < 0) {
    return absl::DataLossError(absl::StrCat(
        path, " does not hold an iteration number: \"", *text, "\""));
  }
  return it;
}

std::vector<int64_t> ListCheckpoints(const std::string& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, "iter_")) continue;
    int64_t it;
    if (!absl::SimpleAtoi(name.substr(5), &it)) continue;  // .tmp, .old
    if (name != IterationDirName(it)) continue;
    if (!file_util::Exists(
            file_util::JoinPath(entry.path().string(), kMetadataFileName))) {
      continue;
    }
    out.push_back(it);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace mcc
