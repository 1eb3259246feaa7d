#include "models/moe/token_drop.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "parallel/context_parallel/chunk_layout.h"

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

absl::StatusOr<int64_t> DropOverCapacityInContext(
    const Tensor& gathered_indices, const Tensor& gathered_weights,
    int64_t sequences, int context_size, int context_rank, int64_t num_experts,
    double capacity_factor, TokenDropPolicy policy, Tensor* dispatch_indices,
    Tensor* dispatch_weights) {
  const int c_size = context_size;
  if (c_size < 1 || context_rank < 0 || context_rank >= c_size ||
      sequences < 1 || gathered_indices.dim() != 2 ||
      gathered_indices.shape() != gathered_weights.shape() ||
      dispatch_indices->dim() != 2 ||
      gathered_indices.size(0) != c_size * dispatch_indices->size(0) ||
      gathered_indices.size(1) != dispatch_indices->size(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DropOverCapacityInContext: gathered ", gathered_indices.Describe(),
        " and ", gathered_weights.Describe(), " are not ", c_size,
        " ranks' slots like ", dispatch_indices->Describe(), " (rank ",
        context_rank, ")"));
  }
  const int64_t t = dispatch_indices->size(0), k = dispatch_indices->size(1);
  const int64_t local_length = t / sequences;
  if (t % sequences != 0 || local_length % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DropOverCapacityInContext: ", t, " tokens per rank are not ",
        sequences, " sequences of two equal chunks"));
  }
  const int64_t chunk = local_length / 2;
  // The serial row of rank c's row r: position P of sequence r % sequences
  // is row P * sequences (hidden states lie [s, b]).
  auto serial_row = [&](int c, int64_t r) {
    const int64_t p = r / sequences;
    const int64_t global_p = context_parallel::ChunkLayout::GlobalChunk(
                                 c_size, c, static_cast<int>(p / chunk)) *
                                 chunk +
                             p % chunk;
    return global_p * sequences + r % sequences;
  };
  const int64_t total = c_size * t;
  Tensor serial_idx = Tensor::Empty({total, k}, DType::kInt32);
  Tensor serial_w = Tensor::Empty({total, k}, DType::kFloat32);
  if (gathered_indices.dtype() != DType::kInt32 ||
      gathered_weights.dtype() != DType::kFloat32 ||
      !gathered_indices.device().is_cpu() ||
      !gathered_weights.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DropOverCapacityInContext runs on the host over int32 indices and "
        "fp32 weights: ",
        gathered_indices.Describe(), ", ", gathered_weights.Describe()));
  }
  for (int c = 0; c < c_size; ++c) {
    for (int64_t r = 0; r < t; ++r) {
      const int64_t from = (c * t + r) * k, to = serial_row(c, r) * k;
      std::copy_n(gathered_indices.data<int32_t>() + from, k,
                  serial_idx.data<int32_t>() + to);
      std::copy_n(gathered_weights.data<float>() + from, k,
                  serial_w.data<float>() + to);
    }
  }
  Tensor kept_idx = Tensor::Empty({total, k}, DType::kInt32);
  Tensor kept_w = Tensor::Empty({total, k}, DType::kFloat32);
  MCC_RETURN_IF_ERROR(
      DropOverCapacity(serial_idx, serial_w, num_experts,
                       ExpertCapacity(total, k, num_experts, capacity_factor),
                       policy, &kept_idx, &kept_w)
          .status());
  if (!dispatch_indices->device().is_cpu() ||
      !dispatch_weights->device().is_cpu() ||
      dispatch_indices->dtype() != DType::kInt32 ||
      dispatch_weights->dtype() != DType::kFloat32 ||
      dispatch_weights->shape() != dispatch_indices->shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DropOverCapacityInContext: outputs ", dispatch_indices->Describe(),
        ", ", dispatch_weights->Describe(),
        " must be host int32 and fp32 [tokens, k]"));
  }
  int64_t dropped = 0;
  for (int64_t r = 0; r < t; ++r) {
    const int64_t from = serial_row(context_rank, r) * k;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = kept_idx.data<int32_t>()[from + i];
      dispatch_indices->data<int32_t>()[r * k + i] = e;
      dispatch_weights->data<float>()[r * k + i] =
          kept_w.data<float>()[from + i];
      if (e == num_experts) ++dropped;
    }
  }
  return dropped;
}

}  // namespace moe
}  // namespace mcc
