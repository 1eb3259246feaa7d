#include "data/npy.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mcc::data {
namespace {

template <typename T>
const char* Descr();
template <>
const char* Descr<int16_t>() {
  return "<i2";
}
template <>
const char* Descr<int32_t>() {
  return "<i4";
}
template <>
const char* Descr<uint32_t>() {
  return "<u4";
}
template <>
const char* Descr<int64_t>() {
  return "<i8";
}
template <>
const char* Descr<double>() {
  return "<f8";
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  bool ok =
      std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status SaveNpy(const std::string& path, const std::vector<T>& values,
                     const std::vector<int64_t>& shape) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string header =
      absl::StrCat("{'descr': '", Descr<T>(),
                   "', 'fortran_order': False, 'shape': (", dims, "), }");
  // Pad so that magic(6) + version(2) + len(2) + header ends on 64 bytes.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.append(reinterpret_cast<const char*>(&len), 2);
  out += header;
  out.append(reinterpret_cast<const char*>(values.data()),
             values.size() * sizeof(T));
  return WriteFileAtomically(path, out);
}

template <typename T>
absl::StatusOr<std::vector<T>> LoadNpy(const std::string& path,
                                       std::vector<int64_t>* shape) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  char pre[10];
  if (std::fread(pre, 1, 10, f) != 10 ||
      std::memcmp(pre, "\x93NUMPY", 6) != 0 || pre[6] != 1) {
    std::fclose(f);
    return absl::DataLossError(absl::StrCat(path, ": not a .npy 1.0 file"));
  }
  uint16_t hlen;
  std::memcpy(&hlen, pre + 8, 2);
  std::string header(hlen, '\0');
  if (std::fread(header.data(), 1, hlen, f) != hlen) {
    std::fclose(f);
    return absl::DataLossError(absl::StrCat(path, ": truncated .npy header"));
  }
  const std::string want = absl::StrCat("'descr': '", Descr<T>(), "'");
  const size_t sp = header.find("'shape': (");
  if (header.find(want) == std::string::npos || sp == std::string::npos ||
      header.find("'fortran_order': False") == std::string::npos) {
    std::fclose(f);
    return absl::DataLossError(absl::StrCat(path, ": unexpected .npy header ",
                                            header, " (want ", want, ")"));
  }
  const size_t close = header.find(')', sp);
  std::string dims = header.substr(sp + 10, close - sp - 10);
  shape->clear();
  int64_t count = 1;
  for (absl::string_view d :
       absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    int64_t v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &v) || v < 0) {
      std::fclose(f);
      return absl::DataLossError(absl::StrCat(path, ": bad shape ", dims));
    }
    shape->push_back(v);
    count *= v;
  }
  std::vector<T> values(count);
  const size_t got = std::fread(values.data(), sizeof(T), count, f);
  std::fclose(f);
  if (got != static_cast<size_t>(count)) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: ", got, " of ", count, " elements"));
  }
  return values;
}

#define MCC_NPY_INSTANTIATE(T)                                                \
  template absl::Status SaveNpy<T>(const std::string&, const std::vector<T>&, \
                                   const std::vector<int64_t>&);              \
  template absl::StatusOr<std::vector<T>> LoadNpy<T>(const std::string&,      \
                                                     std::vector<int64_t>*);
MCC_NPY_INSTANTIATE(int16_t)
MCC_NPY_INSTANTIATE(int32_t)
MCC_NPY_INSTANTIATE(uint32_t)
MCC_NPY_INSTANTIATE(int64_t)
MCC_NPY_INSTANTIATE(double)
#undef MCC_NPY_INSTANTIATE

}  // namespace mcc::data
