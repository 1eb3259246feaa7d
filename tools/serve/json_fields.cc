#include "tools/serve/json_fields.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace mcc {
namespace serve {

absl::StatusOr<nlohmann::json> ParseJsonObject(absl::string_view body) {
  nlohmann::json j = nlohmann::json::parse(body.begin(), body.end(), nullptr,
                                           /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError("the request body is not valid JSON");
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError("the request body must be a JSON object");
  }
  return j;
}

namespace {
const nlohmann::json* Field(const nlohmann::json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}
}  // namespace

absl::Status ReadInt(const nlohmann::json& obj, const char* name,
                     int64_t* out) {
  const nlohmann::json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() >
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(name, " is too large"));
    }
    *out = v->get<int64_t>();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be an integer, got ", v->type_name()));
}

absl::Status ReadNumber(const nlohmann::json& obj, const char* name,
                        double* out) {
  const nlohmann::json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be a number, got ", v->type_name()));
  }
  *out = v->get<double>();
  if (!std::isfinite(*out)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be finite"));
  }
  return absl::OkStatus();
}

absl::Status ReadBool(const nlohmann::json& obj, const char* name, bool* out) {
  const nlohmann::json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be a boolean, got ", v->type_name()));
  }
  *out = v->get<bool>();
  return absl::OkStatus();
}

std::string Dump(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::Status ReadSamplingFields(const nlohmann::json& j, double* temperature,
                                double* top_p, int* top_k,
                                std::vector<std::string>* stop_out) {
  auto bad = [](const char* m) { return absl::InvalidArgumentError(m); };
  MCC_RETURN_IF_ERROR(ReadNumber(j, "temperature", temperature));
  if (!(*temperature >= 0 && *temperature <= 2)) {
    return bad("temperature must be in [0, 2]");
  }
  MCC_RETURN_IF_ERROR(ReadNumber(j, "top_p", top_p));
  if (!(*top_p > 0 && *top_p <= 1)) return bad("top_p must be in (0, 1]");
  int64_t k = *top_k;
  MCC_RETURN_IF_ERROR(ReadInt(j, "top_k", &k));
  if (k < 0 || k > 1000000) return bad("top_k must be >= 0");
  *top_k = static_cast<int>(k);
  auto stop = j.find("stop");
  if (stop != j.end() && !stop->is_null()) {
    if (stop->is_string()) {
      stop_out->push_back(stop->get<std::string>());
    } else if (stop->is_array() && stop->size() <= 4) {
      for (const auto& s : *stop) {
        if (!s.is_string()) {
          return bad("stop must be a string or a list of strings");
        }
        stop_out->push_back(s.get<std::string>());
      }
    } else {
      return bad("stop must be a string or a list of at most 4 strings");
    }
  }
  return absl::OkStatus();
}

}  // namespace serve
}  // namespace mcc
