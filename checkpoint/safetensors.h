#ifndef CHECKPOINT_SAFETENSORS_H_
#define CHECKPOINT_SAFETENSORS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace mcc {

// Hugging Face safetensors files: an 8-byte little-endian header length, a
// JSON header {"name": {"dtype": "F32", "shape": [..], "data_offsets":
// [begin, end]}, ..., "__metadata__": {"key": "value"}} padded with spaces to
// a multiple of 8 bytes, then the tensors' bytes back to back (little-endian,
// row-major). dtypes: F32, BF16, F16, I32, I64.

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct SafetensorsFile {
  NamedTensors tensors;  // In order of their data.
  std::map<std::string, std::string> metadata;

  // Nullptr when absent.
  const Tensor* Find(absl::string_view name) const;
};

absl::StatusOr<std::string> SafetensorsDTypeName(DType dtype);  // "F32"
absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name);

// Writes the tensors (CPU or not; copied to host), widest dtype first then
// by name (so each tensor's data is aligned to its element size), atomically
// (temporary file, fsync, rename).
absl::Status WriteSafetensors(
    const std::string& path, const NamedTensors& tensors,
    const std::map<std::string, std::string>& metadata = {});

// Reads and validates a whole file: errors name the file and the tensor at
// fault (unknown dtype, offsets that do not match the shape, overlap, a
// truncated file).
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);
// The same, from the file's bytes; `path` only names it in errors.
absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 const std::string& path);

}  // namespace mcc

#endif  // CHECKPOINT_SAFETENSORS_H_
