#ifndef CORE_TESTING_FUZZ_FUZZ_INPUT_H_
#define CORE_TESTING_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace mcc::fuzz {

// Fuzz targets that read several files at once (an .idx and its .bin, a
// vocabulary and the text to encode) take them as one input, the parts joined
// by this line. Text seeds stay readable, and a mutation that breaks the
// separator only moves bytes from one part into another.
inline constexpr absl::string_view kPartSeparator = "\n~~~~~~~~\n";

// The first `count` parts of data; missing parts are empty, and everything
// after the last separator that counts stays in the last part.
inline std::vector<std::string> SplitParts(const uint8_t* data, size_t size,
                                           int count) {
  absl::string_view all(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts =
      absl::StrSplit(all, absl::MaxSplits(kPartSeparator, count - 1));
  parts.resize(count);
  return parts;
}

}  // namespace mcc::fuzz

#endif  // CORE_TESTING_FUZZ_FUZZ_INPUT_H_
