#include "parallel/testing/device_parity.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "core/status_macros.h"

namespace mcc {
namespace parallel {
namespace testing {

std::string Bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return absl::StrFormat("%08x", u);
}

std::string Bits(double v) {
  uint64_t u;
  std::memcpy(&u, &v, sizeof(u));
  return absl::StrFormat("%016x", u);
}

Device ParityDevice(const std::string& name) {
  return name == "cpu" ? Device::CPU() : Device::TestDevice();
}

absl::StatusOr<comm::World> InitParityWorld(Device device) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  options.device = device;  // Every group moves this device's tensors.
  return comm::InitWorldFromEnvironment(options);
}

absl::StatusOr<ParityJob> InitParityJob(Device device, ParallelSizes sizes) {
  ParityJob job;
  MCC_ASSIGN_OR_RETURN(job.world, InitParityWorld(device));
  MCC_ASSIGN_OR_RETURN(job.state,
                       ParallelState::Create(job.world.group, sizes));
  return job;
}

absl::StatusOr<std::string> BitsLine(const std::string& label,
                                     const Tensor& t) {
  Tensor host = t;
  if (!t.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(host, t.To(Device::CPU()));
  }
  std::string line = label;
  for (float v : host.ToFloats()) absl::StrAppend(&line, " ", Bits(v));
  return line;
}

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", name);
}

absl::Status WriteLines(const std::string& path,
                        const std::vector<std::string>& lines) {
  std::ofstream out(path);
  for (const std::string& line : lines) out << line << "\n";
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

}  // namespace testing
}  // namespace parallel
}  // namespace mcc
