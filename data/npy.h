#ifndef DATA_NPY_H_
#define DATA_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc::data {

// Minimal .npy (format 1.0, little-endian, C order) for the index caches, so
// numpy.load reads them as Megatron's cached indices are read.
template <typename T>
absl::Status SaveNpy(const std::string& path, const std::vector<T>& values,
                     const std::vector<int64_t>& shape);

// Loads a .npy whose element type is T (exactly), returning its values and
// setting *shape.
template <typename T>
absl::StatusOr<std::vector<T>> LoadNpy(const std::string& path,
                                       std::vector<int64_t>* shape);
// The same from the file's bytes; path only names it in errors.
template <typename T>
absl::StatusOr<std::vector<T>> ParseNpy(const std::string& path,
                                        absl::string_view bytes,
                                        std::vector<int64_t>* shape);

// Writes contents to path through a temporary file and a rename.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents);

}  // namespace mcc::data

#endif  // DATA_NPY_H_
