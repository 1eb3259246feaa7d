// Merges the per-rank timelines that `train --profile` writes into one
// Chrome trace with a track per rank, the ranks' clocks aligned on the start
// barrier:
//   merge_traces DIR [--output FILE]
// reads DIR/*.json except the output (default DIR/merged_trace.json).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "observability/trace_merge.h"

int main(int argc, char** argv) {
  std::string dir, output;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--output" || arg == "-o") && i + 1 < argc) {
      output = argv[++i];
    } else if (dir.empty() && arg[0] != '-') {
      dir = arg;
    } else {
      std::cerr << "usage: merge_traces DIR [--output FILE]\n";
      return 2;
    }
  }
  if (dir.empty()) {
    std::cerr << "usage: merge_traces DIR [--output FILE]\n";
    return 2;
  }
  if (output.empty()) output = dir + "/merged_trace.json";
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string p = entry.path().string();
    if (entry.path().extension() == ".json" &&
        std::filesystem::absolute(p) != std::filesystem::absolute(output)) {
      paths.push_back(p);
    }
  }
  if (ec) {
    std::cerr << "merge_traces: cannot read " << dir << ": " << ec.message()
              << "\n";
    return 1;
  }
  if (paths.empty()) {
    std::cerr << "merge_traces: no .json traces in " << dir << "\n";
    return 1;
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> texts;
  for (const std::string& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream buf;
    buf << in.rdbuf();
    if (!in) {
      std::cerr << "merge_traces: cannot read " << p << "\n";
      return 1;
    }
    texts.push_back(buf.str());
  }
  absl::StatusOr<std::string> merged =
      mcc::observability::MergeChromeTraces(texts, paths);
  if (!merged.ok()) {
    std::cerr << "merge_traces: " << merged.status().message() << "\n";
    return 1;
  }
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  out << *merged;
  out.close();
  if (!out) {
    std::cerr << "merge_traces: cannot write " << output << "\n";
    return 1;
  }
  std::cout << "merged " << paths.size() << " traces into " << output << "\n";
  return 0;
}
