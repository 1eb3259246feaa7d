// Names the ranks behind in a hung or timed-out job from the flight-recorder
// dumps its ranks wrote (train --flight-recorder-dir DIR):
//   analyze_hang DIR [--world-size N]
// prints one finding per line, e.g.
//   ranks 0-2 wait in AllReduce #512 of group 'dp'; rank 3 last finished
//   #511 of group 'dp' and is in Send (p2p #88) to rank 1 of group 'pp'
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "core/comm/hang_analysis.h"

int main(int argc, char** argv) {
  std::string dir;
  int world_size = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--world-size" && i + 1 < argc &&
        absl::SimpleAtoi(argv[i + 1], &world_size)) {
      ++i;
    } else if (dir.empty() && arg[0] != '-') {
      dir = arg;
    } else {
      std::cerr << "usage: analyze_hang DIR [--world-size N]\n";
      return 2;
    }
  }
  if (dir.empty()) {
    std::cerr << "usage: analyze_hang DIR [--world-size N]\n";
    return 2;
  }
  std::map<std::string, std::string> dumps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!absl::StartsWith(name, "flight_recorder_rank") ||
        !absl::EndsWith(name, ".json")) {
      continue;
    }
    std::ifstream in(e.path());
    std::stringstream buf;
    buf << in.rdbuf();
    dumps[e.path().string()] = buf.str();
  }
  if (ec) {
    std::cerr << "analyze_hang: cannot read " << dir << ": " << ec.message()
              << "\n";
    return 1;
  }
  if (dumps.empty()) {
    std::cerr << "analyze_hang: no flight_recorder_rank*.json in " << dir
              << "\n";
    return 1;
  }
  absl::StatusOr<std::vector<std::string>> findings =
      mcc::comm::AnalyzeHang(dumps, world_size);
  if (!findings.ok()) {
    std::cerr << "analyze_hang: " << findings.status().message() << "\n";
    return 1;
  }
  std::cout << "read " << dumps.size() << " dumps from " << dir << "\n";
  for (const std::string& f : *findings) std::cout << f << "\n";
  return 0;
}
