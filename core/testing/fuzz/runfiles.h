#ifndef CORE_TESTING_FUZZ_RUNFILES_H_
#define CORE_TESTING_FUZZ_RUNFILES_H_

#include <cstdlib>
#include <filesystem>
#include <string>

namespace mcc::fuzz {

// Where a data file of a fuzz target (a workspace-relative path) lies: under
// the test's runfiles (TEST_SRCDIR) when bazel test runs it, under
// "<argv0>.runfiles/megatron_cpp" when a fuzzer binary is run by hand, else
// relative to the working directory.
inline std::string FuzzRunfile(const char* argv0, const std::string& path) {
  if (const char* dir = std::getenv("TEST_SRCDIR")) {
    return std::string(dir) + "/megatron_cpp/" + path;
  }
  if (argv0 != nullptr) {
    const std::string beside =
        std::string(argv0) + ".runfiles/megatron_cpp/" + path;
    if (std::filesystem::exists(beside)) return beside;
  }
  return path;
}

}  // namespace mcc::fuzz

#endif  // CORE_TESTING_FUZZ_RUNFILES_H_
