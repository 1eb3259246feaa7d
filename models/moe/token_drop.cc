#include "models/moe/token_drop.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace moe {

absl::StatusOr<TokenDropPolicy> ParseTokenDropPolicy(absl::string_view name) {
  if (name == "probs") return TokenDropPolicy::kProbs;
  if (name == "position") return TokenDropPolicy::kPosition;
  return absl::InvalidArgumentError(absl::StrCat(
      "--moe-token-drop-policy '", name, "' is not one of: probs, position"));
}

const char* TokenDropPolicyName(TokenDropPolicy policy) {
  return policy == TokenDropPolicy::kProbs ? "probs" : "position";
}

int64_t ExpertCapacity(int64_t tokens, int64_t topk, int64_t num_experts,
                       double capacity_factor) {
  // Megatron: ceil((num_tokens / num_experts) * capacity_factor) in doubles.
  return static_cast<int64_t>(std::ceil(static_cast<double>(tokens * topk) /
                                        num_experts * capacity_factor));
}

absl::StatusOr<int64_t> DropOverCapacity(const Tensor& indices,
                                         const Tensor& weights,
                                         int64_t num_experts, int64_t capacity,
                                         TokenDropPolicy policy,
                                         Tensor* dispatch_indices,
                                         Tensor* dispatch_weights) {
  if (indices.dtype() != DType::kInt32 || indices.dim() != 2 ||
      weights.dtype() != DType::kFloat32 ||
      weights.shape() != indices.shape() ||
      dispatch_indices->shape() != indices.shape() ||
      dispatch_indices->dtype() != DType::kInt32 ||
      dispatch_weights->shape() != indices.shape() ||
      dispatch_weights->dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DropOverCapacity: indices ", indices.Describe(), " and weights ",
        weights.Describe(),
        " must be int32 and fp32 [tokens, k], as the outputs ",
        dispatch_indices->Describe(), ", ", dispatch_weights->Describe()));
  }
  for (const Tensor* t :
       {&indices, &weights, static_cast<const Tensor*>(dispatch_indices),
        static_cast<const Tensor*>(dispatch_weights)}) {
    if (t->device() != Device::CPU()) {
      return absl::InvalidArgumentError(
          absl::StrCat("DropOverCapacity runs on the host: ", t->Describe()));
    }
  }
  if (capacity < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DropOverCapacity: capacity ", capacity, " is negative"));
  }
  const int64_t slots = indices.numel();
  const int32_t* idx = indices.data<int32_t>();
  const float* w = weights.data<float>();
  // Slots per expert, in slot (token, then choice) order.
  std::vector<std::vector<int64_t>> routed(num_experts);
  for (int64_t s = 0; s < slots; ++s) {
    if (idx[s] < 0 || idx[s] >= num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("DropOverCapacity: indices[", s, "] = ", idx[s],
                       " is outside [0, ", num_experts, ")"));
    }
    routed[idx[s]].push_back(s);
  }
  int32_t* out_idx = dispatch_indices->data<int32_t>();
  float* out_w = dispatch_weights->data<float>();
  std::copy(idx, idx + slots, out_idx);
  std::copy(w, w + slots, out_w);
  int64_t dropped = 0;
  for (std::vector<int64_t>& list : routed) {
    if (static_cast<int64_t>(list.size()) <= capacity) continue;
    if (policy == TokenDropPolicy::kProbs) {
      // A token reaches an expert once, so slot order is token order.
      std::stable_sort(list.begin(), list.end(),
                       [&](int64_t a, int64_t b) { return w[a] > w[b]; });
    }
    for (size_t i = capacity; i < list.size(); ++i) {
      out_idx[list[i]] = static_cast<int32_t>(num_experts);
      out_w[list[i]] = 0.0f;
      ++dropped;
    }
  }
  return dropped;
}

}  // namespace moe
}  // namespace mcc
