#include "checkpoint/hf_common.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"

namespace mcc {
namespace {

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string ShardName(int n, int of) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", n, of);
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

int64_t HfVocabRows(const checkpoint::ModelConfig& c) {
  return c.vocab_size() > 0 ? c.vocab_size() : c.padded_vocab_size();
}

absl::StatusOr<Tensor> KeepRows(const Tensor& t, int64_t rows) {
  Tensor cpu = t;
  if (!cpu.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(cpu, t.To(Device::CPU()));
  }
  MCC_ASSIGN_OR_RETURN(Tensor kept, cpu.Slice(0, rows));
  return kept.Clone();
}

Tensor PadRows(const Tensor& t, const Shape& shape) {
  Tensor r = Tensor::Zeros(shape, t.dtype());
  std::memcpy(r.raw_data(), t.raw_data(), t.nbytes());
  return r;
}

absl::StatusOr<int64_t> JsonPositiveInt(const JsonDocument& json,
                                        const std::string& key,
                                        const std::string& path,
                                        std::optional<int64_t> fallback) {
  if (!json.contains(key) || json[key].is_null()) {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": missing \"", key, "\""));
  }
  const JsonDocument& v = json[key];
  // nlohmann stores every non-negative integer as unsigned.
  if (!v.is_number_unsigned() || v.get<uint64_t>() == 0 ||
      v.get<uint64_t>() > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"", key, "\" must be a positive 32-bit integer",
                     v.is_number_integer() ? ", got " + v.dump() : ""));
  }
  return static_cast<int64_t>(v.get<uint64_t>());
}

absl::StatusOr<double> JsonPositiveNumber(const JsonDocument& json,
                                          const std::string& key,
                                          const std::string& path,
                                          double fallback) {
  if (!json.contains(key) || json[key].is_null()) return fallback;
  const JsonDocument& v = json[key];
  const double x = v.is_number() ? v.get<double>() : 0.0;
  if (!v.is_number() || !(x > 0) || !std::isfinite(x)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"", key, "\" must be a positive number"));
  }
  return x;
}

absl::StatusOr<bool> JsonBool(const JsonDocument& json, const std::string& key,
                              const std::string& path, bool fallback) {
  if (!json.contains(key) || json[key].is_null()) return fallback;
  if (!json[key].is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"", key, "\" must be true or false"));
  }
  return json[key].get<bool>();
}

absl::StatusOr<JsonDocument> ParseHfConfigJson(absl::string_view text,
                                               const std::string& path) {
  absl::StatusOr<JsonDocument> parsed = ParseJsonDocument(text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", parsed.status().message()));
  }
  if (!parsed->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a JSON object"));
  }
  return std::move(*parsed);
}

absl::StatusOr<JsonDocument> ReadHfConfigJson(const std::string& dir) {
  const std::string path = dir + "/config.json";
  MCC_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  return ParseHfConfigJson(text, path);
}

absl::StatusOr<Tensor> FindTensorOfShape(
    const std::map<std::string, Tensor>& tensors, const std::string& name,
    const Shape& shape, absl::string_view what, bool to_cpu) {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    return absl::NotFoundError(absl::StrCat(what, " ", name, " is missing"));
  }
  Tensor t = it->second;
  if (to_cpu && !t.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(t, t.To(Device::CPU()));
  }
  if (t.shape() != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", name, " is ", t.Describe(),
                     ", the configuration needs ", ShapeToString(shape)));
  }
  return t;
}

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  std::string s = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  int64_t unit = 1;
  for (const auto& [suffix, scale] :
       std::vector<std::pair<std::string, int64_t>>{
           {"GB", 1000 * 1000 * 1000}, {"MB", 1000 * 1000}, {"KB", 1000}}) {
    if (s.size() > suffix.size() &&
        s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0) {
      s.resize(s.size() - suffix.size());
      unit = scale;
      break;
    }
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(s, &n) || n <= 0 ||
      n > std::numeric_limits<int64_t>::max() / unit) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text,
                     "' is not a positive byte count such as 5GB, 200MB, "
                     "64KB or 123456"));
  }
  return n * unit;
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat("cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::Status WriteHfWeights(
    const std::string& dir, const NamedTensors& tensors,
    int64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata) {
  if (max_shard_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shard size must be positive, got ", max_shard_bytes));
  }
  // Greedy, in order: a shard closes when the next tensor would overflow it.
  std::vector<NamedTensors> shards(1);
  int64_t total = 0, in_shard = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().emplace_back(name, t);
    in_shard += bytes;
    total += bytes;
  }
  // Old weight files of any form would be read instead of (or beside) ours.
  std::remove((dir + "/" + kIndexFile).c_str());
  std::remove((dir + "/" + kSingleFile).c_str());
  if (DIR* d = opendir(dir.c_str())) {
    std::vector<std::string> stale;
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (absl::StartsWith(name, "model-") && absl::StrContains(name, "-of-") &&
          absl::EndsWith(name, ".safetensors")) {
        stale.push_back(name);
      }
    }
    closedir(d);
    for (const std::string& name : stale) {
      std::remove((dir + "/" + name).c_str());
    }
  }
  if (shards.size() == 1) {
    return WriteSafetensors(dir + "/" + kSingleFile, tensors, metadata);
  }
  const int of = static_cast<int>(shards.size());
  JsonDocument weight_map = JsonDocument::object();
  for (int i = 0; i < of; ++i) {
    const std::string file = ShardName(i + 1, of);
    MCC_RETURN_IF_ERROR(
        WriteSafetensors(dir + "/" + file, shards[i], metadata));
    for (const auto& [name, t] : shards[i]) weight_map[name] = file;
  }
  JsonDocument index = {{"metadata", {{"total_size", total}}},
                        {"weight_map", weight_map}};
  return WriteTextFile(dir + "/" + kIndexFile, index.dump(2) + "\n");
}

absl::StatusOr<NamedTensors> ReadHfWeights(const std::string& dir) {
  const std::string index_path = dir + "/" + kIndexFile;
  if (!FileExists(index_path)) {
    MCC_ASSIGN_OR_RETURN(SafetensorsFile file,
                         ReadSafetensors(dir + "/" + kSingleFile));
    return std::move(file.tensors);
  }
  MCC_ASSIGN_OR_RETURN(std::string text, ReadTextFile(index_path));
  absl::StatusOr<JsonDocument> index = ParseJsonDocument(text);
  if (!index.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": ", index.status().message()));
  }
  if (!index->is_object() || !index->contains("weight_map") ||
      !(*index)["weight_map"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": no \"weight_map\" object"));
  }
  // Each file once, in the order the index first names it.
  std::map<std::string, std::set<std::string>> wanted;  // file -> names
  std::vector<std::string> files;
  for (const auto& [name, file] : (*index)["weight_map"].items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path, ": the file of tensor ", name, " is not a string"));
    }
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f[0] == '.') {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": tensor ", name, " maps to '", f,
                       "', not a file name in the directory"));
    }
    if (wanted[f].empty()) files.push_back(f);
    wanted[f].insert(name);
  }
  NamedTensors out;
  std::set<std::string> seen;
  for (const std::string& f : files) {
    MCC_ASSIGN_OR_RETURN(SafetensorsFile shard, ReadSafetensors(dir + "/" + f));
    std::set<std::string> missing = wanted[f];
    for (auto& [name, t] : shard.tensors) {
      if (!seen.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            dir, "/", f, ": tensor ", name, " is also in another shard"));
      }
      missing.erase(name);
      out.emplace_back(name, std::move(t));
    }
    if (!missing.empty()) {
      return absl::NotFoundError(absl::StrCat(index_path, " maps tensor ",
                                              *missing.begin(), " to ", f,
                                              ", which does not hold it"));
    }
  }
  return out;
}

}  // namespace mcc
