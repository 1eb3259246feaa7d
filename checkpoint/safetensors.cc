#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "core/checked_math.h"
#include "core/json_document.h"
#include "core/status_macros.h"

namespace mcc {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100 << 20;  // As the reference reader.

// A JSON integer in [0, 2^63), or nullopt (negative, fractional, too big,
// not a number).
std::optional<int64_t> NonNegativeInt(const JsonDocument& v) {
  // nlohmann stores every non-negative integer as unsigned.
  if (!v.is_number_unsigned()) return std::nullopt;
  const uint64_t u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::nullopt;
  }
  return static_cast<int64_t>(u);
}

}  // namespace

const Tensor* SafetensorsFile::Find(absl::string_view name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<std::string> SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return std::string("F32");
    case DType::kBFloat16:
      return std::string("BF16");
    case DType::kFloat16:
      return std::string("F16");
    case DType::kInt32:
      return std::string("I32");
    case DType::kInt64:
      return std::string("I64");
    case DType::kInt8:
      return std::string("I8");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no safetensors dtype for ", static_cast<int>(dtype)));
}

absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name) {
  if (name == "F32") return DType::kFloat32;
  if (name == "BF16") return DType::kBFloat16;
  if (name == "F16") return DType::kFloat16;
  if (name == "I32") return DType::kInt32;
  if (name == "I64") return DType::kInt64;
  if (name == "I8") return DType::kInt8;
  return absl::UnimplementedError(
      absl::StrCat("unsupported safetensors dtype \"", name,
                   "\" (supported: F32, BF16, F16, I32, I64, I8)"));
}

absl::Status WriteSafetensors(
    const std::string& path, const NamedTensors& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, Tensor>> sorted = tensors;
  // Widest dtype first, then by name (as the reference writer): every
  // tensor's data stays aligned to its element size.
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    const size_t sa = a.second.defined() ? DTypeSize(a.second.dtype()) : 0;
    const size_t sb = b.second.defined() ? DTypeSize(b.second.dtype()) : 0;
    return sa != sb ? sa > sb : a.first < b.first;
  });
  // ordered_json keeps this order in the file (nlohmann::json would sort).
  nlohmann::ordered_json header_json = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json& meta = header_json["__metadata__"];
    for (const auto& [k, v] : metadata) meta[k] = v;
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const auto& [name, t] = sorted[i];
    bool repeated = false;
    for (size_t j = 0; j < i; ++j) repeated |= sorted[j].first == name;
    if (name == "__metadata__" || repeated) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor name \"", name, "\" is reserved or repeated"));
    }
    if (!t.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", name, " is undefined"));
    }
    MCC_ASSIGN_OR_RETURN(std::string dtype, SafetensorsDTypeName(t.dtype()));
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int d = 0; d < t.dim(); ++d) shape.push_back(t.size(d));
    header_json[name] = {{"dtype", dtype},
                         {"shape", std::move(shape)},
                         {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string header;
  try {
    header = header_json.dump();
  } catch (const nlohmann::json::exception& e) {
    // Names and metadata must be UTF-8, as all JSON text.
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot write the header: ", JsonErrorMessage(e)));
  }
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  {
    MCC_ASSIGN_OR_RETURN(auto file, file_util::WritableFile::Create(tmp));
    uint8_t len[8];
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    absl::Status s = file.Append(len, 8);
    if (s.ok()) s = file.Append(header.data(), header.size());
    for (size_t i = 0; s.ok() && i < sorted.size(); ++i) {
      Tensor host = sorted[i].second;
      if (!host.device().is_cpu()) {
        auto h = host.To(Device::CPU());
        if (!h.ok()) {
          s = h.status();
          break;
        }
        host = *h;
      }
      s = file.Append(host.raw_data(), host.nbytes());
    }
    if (s.ok()) s = file.Close();
    if (!s.ok()) {
      (void)file_util::RemoveAll(tmp);
      return s;
    }
  }
  return file_util::Rename(tmp, path);
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes,
                                                 const std::string& path) {
  if (bytes.size() < 8) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", bytes.size(), " bytes, too short for safetensors"));
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  if (n > kMaxHeaderBytes || n > bytes.size() - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", n,
                                            " exceeds the file (", bytes.size(),
                                            " bytes) or 100 MB"));
  }
  absl::StatusOr<JsonDocument> header = ParseJsonDocument(bytes.substr(8, n));
  if (!header.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": bad header: ", header.status().message()));
  }
  if (!header->is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": header is not an object"));
  }
  const absl::string_view data = bytes.substr(8 + n);
  SafetensorsFile out;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (const auto& member : header->items()) {
    // Named, not structured bindings: lambdas below capture them (C++17).
    const std::string& name = member.key();
    const JsonDocument& v = member.value();
    if (name == "__metadata__") {
      if (!v.is_object()) {
        return absl::DataLossError(
            absl::StrCat(path, ": __metadata__ is not an object"));
      }
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) {
          return absl::DataLossError(absl::StrCat(
              path, ": __metadata__ value of \"", k, "\" is not a string"));
        }
        out.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    auto bad = [&](absl::string_view what) {
      return absl::DataLossError(
          absl::StrCat(path, ": tensor ", name, ": ", what));
    };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() ||
        !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      return bad("needs dtype, shape and data_offsets [begin, end]");
    }
    const std::string& dtype = v["dtype"].get_ref<const std::string&>();
    const JsonDocument& offsets = v["data_offsets"];
    auto dt = ParseSafetensorsDType(dtype);
    if (!dt.ok())
      return absl::Status(
          dt.status().code(),
          absl::StrCat(path, ": tensor ", name, ": ", dt.status().message()));
    Shape dims;
    for (const JsonDocument& d : v["shape"]) {
      const std::optional<int64_t> x = NonNegativeInt(d);
      if (!x.has_value()) return bad("bad shape");
      dims.push_back(*x);
    }
    const std::optional<int64_t> b = NonNegativeInt(offsets[0]);
    const std::optional<int64_t> e = NonNegativeInt(offsets[1]);
    if (!b.has_value() || !e.has_value() || *e < *b) {
      return bad("bad data_offsets");
    }
    const std::optional<int64_t> bytes =
        CheckedNumBytes(dims, static_cast<int64_t>(DTypeSize(*dt)));
    if (!bytes.has_value()) {
      return bad(absl::StrCat("shape ", ShapeToString(dims), " of ", dtype,
                              " overflows a 64-bit byte count"));
    }
    const uint64_t want = static_cast<uint64_t>(*bytes);
    if (static_cast<uint64_t>(*e - *b) != want) {
      return bad(absl::StrCat("data_offsets [", *b, ", ", *e, "] hold ",
                              *e - *b, " bytes but ", dtype,
                              ShapeToString(dims), " needs ", want));
    }
    if (static_cast<uint64_t>(*e) > data.size()) {
      return bad(absl::StrCat("data_offsets end ", *e, " is past the data (",
                              data.size(), " bytes): truncated file?"));
    }
    Tensor t = Tensor::Empty(dims, *dt);
    std::memcpy(t.raw_data(), data.data() + *b, want);
    spans.push_back(
        {static_cast<uint64_t>(*b), static_cast<uint64_t>(*e), name});
    out.tensors.emplace_back(name, std::move(t));
  }
  // The tensors must tile the data without gaps or overlap.
  std::vector<size_t> order(spans.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return spans[a].begin != spans[b].begin ? spans[a].begin < spans[b].begin
                                            : spans[a].end < spans[b].end;
  });
  uint64_t pos = 0;
  NamedTensors ordered;
  for (size_t i : order) {
    if (spans[i].begin != pos) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensor ", spans[i].name, " starts at byte ", spans[i].begin,
          " of the data, expected ", pos, " (gap or overlap)"));
    }
    pos = spans[i].end;
    ordered.push_back(std::move(out.tensors[i]));
  }
  if (pos != data.size()) {
    return absl::DataLossError(absl::StrCat(path, ": ", data.size() - pos,
                                            " bytes after the last tensor"));
  }
  out.tensors = std::move(ordered);
  return out;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  MCC_ASSIGN_OR_RETURN(std::string bytes, file_util::ReadFileToString(path));
  return ParseSafetensors(bytes, path);
}

}  // namespace mcc
