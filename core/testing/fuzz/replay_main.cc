// main() for a fuzz entry point built without libFuzzer: runs
// LLVMFuzzerTestOneInput over every file named on the command line (or found
// under a named directory), then over a fixed set of mutations of each, so
// the default toolchain checks the seeds, the kept regression inputs and
// their near neighbours on every test run. Deterministic: the mutations come
// from a fixed seed.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv)
    __attribute__((weak));

namespace {

// Mutations per input, past the truncations.
constexpr int kMutations = 48;

void Run(const std::string& bytes) {
  // A copy of exactly the input's size, so ASan sees reads past its end.
  std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(copy.data(), copy.size());
}

// Flips, overwrites with boundary values, inserts, deletes or duplicates.
std::string Mutate(const std::string& in, std::mt19937_64& rng) {
  std::string s = in;
  const int edits = 1 + rng() % 4;
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 6) {
      case 0:
        if (!s.empty()) s[pos] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1: {
        static const char kSpecial[] = {'\0', '\xff', '\x7f', '\x80', '"',
                                        '\\', '{',    '[',    '9',    '-'};
        if (!s.empty()) s[pos] = kSpecial[rng() % sizeof(kSpecial)];
        break;
      }
      case 2:
        s.insert(pos, 1, static_cast<char>(rng() % 256));
        break;
      case 3:
        if (!s.empty()) s.erase(pos, 1 + rng() % 8);
        break;
      case 4:
        if (!s.empty()) s.insert(pos, s.substr(pos, 1 + rng() % 16));
        break;
      case 5:  // A large count or length where one is read.
        if (s.size() >= pos + 8) {
          const uint64_t v = rng() % 2 ? ~0ull >> (rng() % 64) : rng();
          for (int i = 0; i < 8; ++i)
            s[pos + i] = static_cast<char>(v >> 8 * i);
        }
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path().string());
      }
    } else {
      files.push_back(p.string());
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  long runs = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    std::ifstream in(files[f], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", files[f].c_str());
      return 1;
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    Run(bytes);
    ++runs;
    for (int k = 0; k < 8; ++k) {
      Run(bytes.substr(0, bytes.size() * k / 8));
      ++runs;
    }
    std::mt19937_64 rng(f + 1);
    for (int m = 0; m < kMutations; ++m) {
      Run(Mutate(bytes, rng));
      ++runs;
    }
  }
  std::printf("replayed %zu input(s), %ld run(s) with mutations\n",
              files.size(), runs);
  return 0;
}
