// Fuzzes safetensors files (ParseSafetensors: the 8-byte header length, the
// JSON header and the data offsets). A file the reader accepts must hold
// tensors whose bytes lie inside it and match their shapes and dtypes.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "glog/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto file = mcc::ParseSafetensors(bytes, "model.safetensors");
  if (!file.ok()) {
    CHECK(
        absl::string_view(file.status().message()).find("model.safetensors") !=
        absl::string_view::npos)
        << "error names no file: " << file.status();
    return 0;
  }
  size_t total = 0;
  for (const auto& [name, t] : file->tensors) {
    CHECK(t.defined()) << name;
    total += t.nbytes();
    CHECK(file->Find(name) != nullptr) << name;
  }
  CHECK_LE(total, size);
  return 0;
}
