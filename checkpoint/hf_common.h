#ifndef CHECKPOINT_HF_COMMON_H_
#define CHECKPOINT_HF_COMMON_H_

// What the Hugging Face mappings (hf_gpt2, hf_llama) share: the true
// vocabulary rows, config.json values checked with errors that name the file
// and key, and a model directory's weights as one model.safetensors or as
// shards model-0000N-of-0000M.safetensors listed by
// model.safetensors.index.json. Functions are thread-compatible (no shared
// state) and leave nothing half-written on error (files are written to a
// temporary name and renamed).

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/config.pb.h"
#include "checkpoint/safetensors.h"
#include "core/json_document.h"
#include "core/tensor.h"

namespace mcc {

// The true vocabulary: the rows Hugging Face files hold (never the TP
// padding that older checkpoints stored).
int64_t HfVocabRows(const checkpoint::ModelConfig& config);

// The first `rows` rows of t, a copy on the CPU.
absl::StatusOr<Tensor> KeepRows(const Tensor& t, int64_t rows);
// t (CPU) below which zero rows fill `shape` (shape[0] >= t.size(0)).
Tensor PadRows(const Tensor& t, const Shape& shape);

// config.json values. A missing or null key takes `fallback`, or is an error
// when there is none; errors name `path` and the key.
absl::StatusOr<int64_t> JsonPositiveInt(const JsonDocument& json,
                                        const std::string& key,
                                        const std::string& path,
                                        std::optional<int64_t> fallback);
absl::StatusOr<double> JsonPositiveNumber(const JsonDocument& json,
                                          const std::string& key,
                                          const std::string& path,
                                          double fallback);
absl::StatusOr<bool> JsonBool(const JsonDocument& json, const std::string& key,
                              const std::string& path, bool fallback);
// The text of a config.json read from `path`, parsed; must be an object.
absl::StatusOr<JsonDocument> ParseHfConfigJson(absl::string_view text,
                                               const std::string& path);
// The whole config.json of a model directory, parsed; must be an object.
absl::StatusOr<JsonDocument> ReadHfConfigJson(const std::string& dir);

// The tensor `name` of `tensors`, which must have `shape`: how each mapping
// looks up an entry of its tensor table, ours on export and Hugging Face's
// on import. Moved to the CPU first when `to_cpu`. Errors begin with `what`
// ("GPT-2 import: tensor"): "<what> <name> is missing" (NotFound) and
// "<what> <name> is <tensor>, the configuration needs <shape>".
absl::StatusOr<Tensor> FindTensorOfShape(
    const std::map<std::string, Tensor>& tensors, const std::string& name,
    const Shape& shape, absl::string_view what, bool to_cpu = false);

// A byte count such as "5GB", "200MB", "64KB" (powers of 1000, as Hugging
// Face's max_shard_size) or plain "123456"; must be positive.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

// Writes the tensors into dir (which must exist): one model.safetensors
// when their data fits in max_shard_bytes, else shards of at most that size
// (a single tensor larger than it gets a shard of its own), in the order
// given, as model-00001-of-0000M.safetensors ... plus
// model.safetensors.index.json ({"metadata": {"total_size": bytes},
// "weight_map": {name: file}}). Any weight file of the other form already in
// dir is removed, so a reader never sees both. metadata goes into every
// file's header.
absl::Status WriteHfWeights(
    const std::string& dir, const NamedTensors& tensors,
    int64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata = {});

// Reads a directory's weights: model.safetensors.index.json and the shards
// it names when the index exists, else model.safetensors. Errors name the
// file: a shard that is missing, a tensor the index maps to a file that
// lacks it, a tensor in two shards.
absl::StatusOr<NamedTensors> ReadHfWeights(const std::string& dir);

// Writes text to path atomically (temporary file, rename).
absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace mcc

#endif  // CHECKPOINT_HF_COMMON_H_
