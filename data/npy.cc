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
#include "core/file_system.h"

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
  // Through the file system interface, so tests can inject failures; the
  // final name is only ever the whole file, synced before the rename.
  FileSystem* fs = GetFileSystem();
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  absl::Status status;
  {
    auto file = fs->NewWritableFile(tmp);
    status = file.status();
    if (status.ok()) status = (*file)->Append(contents);
    if (status.ok()) status = (*file)->SyncAndClose();
  }
  if (status.ok()) status = fs->Rename(tmp, path);
  if (!status.ok()) {
    fs->RemoveFile(tmp).IgnoreError();  // May not exist.
    return absl::Status(status.code(), absl::StrCat("cannot write ", path, ": ",
                                                    status.message()));
  }
  const size_t slash = path.find_last_of('/');
  status =
      fs->SyncDir(slash == std::string::npos ? "." : path.substr(0, slash));
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("writing ", path, ": ", status.message()));
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
  std::string bytes;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, got);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) {
    return absl::DataLossError(absl::StrCat("cannot read ", path));
  }
  return ParseNpy<T>(path, bytes, shape);
}

template <typename T>
absl::StatusOr<std::vector<T>> ParseNpy(const std::string& path,
                                        absl::string_view bytes,
                                        std::vector<int64_t>* shape) {
  shape->clear();
  if (bytes.size() < 10 || bytes.substr(0, 6) != "\x93NUMPY" || bytes[6] != 1) {
    return absl::DataLossError(absl::StrCat(path, ": not a .npy 1.0 file"));
  }
  uint16_t hlen;
  std::memcpy(&hlen, bytes.data() + 8, 2);
  if (bytes.size() - 10 < hlen) {
    return absl::DataLossError(absl::StrCat(path, ": truncated .npy header"));
  }
  const std::string header(bytes.substr(10, hlen));
  const absl::string_view body = bytes.substr(10 + hlen);
  const std::string want = absl::StrCat("'descr': '", Descr<T>(), "'");
  const size_t sp = header.find("'shape': (");
  const size_t close =
      sp == std::string::npos ? std::string::npos : header.find(')', sp);
  if (header.find(want) == std::string::npos || close == std::string::npos ||
      header.find("'fortran_order': False") == std::string::npos) {
    return absl::DataLossError(absl::StrCat(path, ": unexpected .npy header ",
                                            header, " (want ", want, ")"));
  }
  const std::string dims = header.substr(sp + 10, close - sp - 10);
  // The element count may not exceed what the file holds, so neither the
  // product nor the allocation can run away.
  const int64_t available = static_cast<int64_t>(body.size() / sizeof(T));
  int64_t count = 1;
  for (absl::string_view d :
       absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    int64_t v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &v) || v < 0) {
      return absl::DataLossError(absl::StrCat(path, ": bad shape ", dims));
    }
    shape->push_back(v);
    if (v != 0 && count > available / v) {
      return absl::DataLossError(
          absl::StrCat(path, ": shape (", dims, ") needs more than the ",
                       available, " elements the file holds (truncated?)"));
    }
    count *= v;
  }
  if (count > available) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: ", available,
                                            " of ", count, " elements"));
  }
  std::vector<T> values(count);
  if (count > 0) std::memcpy(values.data(), body.data(), count * sizeof(T));
  return values;
}

#define MCC_NPY_INSTANTIATE(T)                                                \
  template absl::Status SaveNpy<T>(const std::string&, const std::vector<T>&, \
                                   const std::vector<int64_t>&);              \
  template absl::StatusOr<std::vector<T>> LoadNpy<T>(const std::string&,      \
                                                     std::vector<int64_t>*);  \
  template absl::StatusOr<std::vector<T>> ParseNpy<T>(                        \
      const std::string&, absl::string_view, std::vector<int64_t>*);
MCC_NPY_INSTANTIATE(int16_t)
MCC_NPY_INSTANTIATE(int32_t)
MCC_NPY_INSTANTIATE(uint32_t)
MCC_NPY_INSTANTIATE(int64_t)
MCC_NPY_INSTANTIATE(double)
#undef MCC_NPY_INSTANTIATE

}  // namespace mcc::data
