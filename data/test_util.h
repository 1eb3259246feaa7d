#ifndef DATA_TEST_UTIL_H_
#define DATA_TEST_UTIL_H_

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace mcc::data::testing {

// A fresh directory under the test's temporary directory.
inline std::string TempDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(t != nullptr ? t : "/tmp") + "/" + name;
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) return "/tmp";
  return dir;
}

// A runfile path of this workspace ("data/testdata/x").
inline std::string Runfile(const std::string& path) {
  const char* s = std::getenv("TEST_SRCDIR");
  const char* w = std::getenv("TEST_WORKSPACE");
  if (s == nullptr) return path;
  return std::string(s) + "/" + (w != nullptr ? w : "__main__") + "/" + path;
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
}

}  // namespace mcc::data::testing

#endif  // DATA_TEST_UTIL_H_
