// Writes the scalars given on the command line to a new event file, for the
// round-trip test that reads them back with an independent reader.
//   write_sample_events DIR TAG=VALUE@STEP ...
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "observability/tensorboard_writer.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: write_sample_events DIR TAG=VALUE@STEP ...\n";
    return 2;
  }
  auto writer = mcc::observability::TensorBoardWriter::Create(argv[1]);
  if (!writer.ok()) {
    std::cerr << writer.status() << "\n";
    return 1;
  }
  for (int i = 2; i < argc; ++i) {
    std::vector<std::string> tag_rest = absl::StrSplit(argv[i], '=');
    std::vector<std::string> value_step =
        absl::StrSplit(tag_rest.size() == 2 ? tag_rest[1] : "", '@');
    double value = 0;
    int64_t step = 0;
    if (tag_rest.size() != 2 || value_step.size() != 2 ||
        !absl::SimpleAtod(value_step[0], &value) ||
        !absl::SimpleAtoi(value_step[1], &step)) {
      std::cerr << "bad scalar '" << argv[i] << "' (want TAG=VALUE@STEP)\n";
      return 2;
    }
    absl::Status status = (*writer)->AddScalar(tag_rest[0], value, step);
    if (!status.ok()) {
      std::cerr << status << "\n";
      return 1;
    }
  }
  absl::Status status = (*writer)->Close();
  if (!status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  std::cout << (*writer)->path() << "\n";
  return 0;
}
