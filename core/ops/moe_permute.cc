#include "core/ops/moe_permute.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

absl::Status Fail(const char* op, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

// An int32 index vector of n entries.
absl::Status CheckIndexVector(const char* op, const Arg& arg, int64_t n) {
  MCC_RETURN_IF_ERROR(CheckDType(op, arg, DType::kInt32));
  if (arg.tensor->dim() != 1 || arg.tensor->numel() != n) {
    return Fail(op, absl::StrCat(arg.name, " ", Brief(*arg.tensor),
                                 " must be [", n, "]"));
  }
  return absl::OkStatus();
}

// A 2-D activation [rows, h].
absl::Status CheckRows(const char* op, const Arg& arg) {
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, arg));
  if (arg.tensor->dim() != 2) {
    return Fail(op, absl::StrCat(arg.name, " ", Brief(*arg.tensor),
                                 " must be 2-D [rows, hidden]"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDType(const char* op, const Arg& a, const Arg& b) {
  if (a.tensor->dtype() != b.tensor->dtype()) {
    return Fail(
        op, absl::StrCat(a.name, " ", Brief(*a.tensor), " and ", b.name, " ",
                         Brief(*b.tensor), " must have one dtype"));
  }
  return absl::OkStatus();
}

// rows = tokens * k for a whole k.
absl::Status CheckCopies(const char* op, int64_t tokens, int64_t rows) {
  if (tokens == 0 ? rows != 0 : rows % tokens != 0) {
    return Fail(op, absl::StrCat(rows,
                                 " permuted rows are not a whole number "
                                 "of copies of ",
                                 tokens, " tokens"));
  }
  return absl::OkStatus();
}

// Index values are data: checked before anything is written.
absl::Status CheckValues(const char* op, const char* name, const Tensor& t,
                         int64_t bound) {
  const int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (p[i] < 0 || p[i] >= bound) {
      return Fail(op, absl::StrCat(name, "[", i, "] = ", p[i],
                                   " is outside [0, ", bound, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status MoeSortTokensCpu(const Tensor& indices, int64_t num_experts,
                              Tensor* row_to_slot, Tensor* slot_to_row,
                              Tensor* tokens_per_expert) {
  MCC_RETURN_IF_ERROR(
      CheckValues("MoeSortTokens", "indices", indices, num_experts));
  const int64_t slots = indices.numel();
  const int32_t* idx = indices.data<int32_t>();
  std::vector<int64_t> start(num_experts + 1, 0);
  for (int64_t s = 0; s < slots; ++s) ++start[idx[s] + 1];
  int64_t* counts = tokens_per_expert->data<int64_t>();
  for (int64_t e = 0; e < num_experts; ++e) {
    counts[e] = start[e + 1];
    start[e + 1] += start[e];
  }
  // Slots in increasing order land in increasing rows of their expert:
  // expert, then token, then choice.
  int32_t* r2s = row_to_slot->data<int32_t>();
  int32_t* s2r = slot_to_row->data<int32_t>();
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t row = start[idx[s]]++;
    r2s[row] = static_cast<int32_t>(s);
    s2r[s] = static_cast<int32_t>(row);
  }
  return absl::OkStatus();
}

absl::Status MoePermuteCpu(const Tensor& x, const Tensor& row_to_slot,
                           Tensor* permuted) {
  const int64_t rows = permuted->size(0), h = x.size(1);
  MCC_RETURN_IF_ERROR(
      CheckValues("MoePermute", "row_to_slot", row_to_slot, rows));
  if (rows == 0) return absl::OkStatus();
  const int64_t k = rows / x.size(0);
  const size_t row_bytes = h * DTypeSize(x.dtype());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(permuted->raw_data());
  const int32_t* r2s = row_to_slot.data<int32_t>();
  ParallelForRows(rows, h, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::memcpy(dst + r * row_bytes, src + (r2s[r] / k) * row_bytes,
                  row_bytes);
    }
  });
  return absl::OkStatus();
}

absl::Status MoeUnpermuteCpu(const Tensor& expert_out,
                             const Tensor& slot_to_row, const Tensor* weights,
                             Tensor* y) {
  const int64_t rows = expert_out.size(0), h = expert_out.size(1);
  const int64_t tokens = y->size(0);
  MCC_RETURN_IF_ERROR(
      CheckValues("MoeUnpermute", "slot_to_row", slot_to_row, rows));
  if (tokens == 0) return absl::OkStatus();
  const int64_t k = rows / tokens;
  const int32_t* s2r = slot_to_row.data<int32_t>();
  const float* w = weights ? weights->data<float>() : nullptr;
  DispatchFloat(y->dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = expert_out.data<T>();
    T* dst = y->data<T>();
    ParallelForRows(tokens, h, [&](int64_t t0, int64_t t1) {
      std::vector<float> acc(h), row(h);
      for (int64_t t = t0; t < t1; ++t) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t i = 0; i < k; ++i) {
          const int64_t s = t * k + i;
          LoadF32(src + s2r[s] * h, row.data(), h);
          const float ws = w ? w[s] : 1.0f;
          for (int64_t j = 0; j < h; ++j) acc[j] += ws * row[j];
        }
        StoreF32(acc.data(), dst + t * h, h);
      }
    });
  });
  return absl::OkStatus();
}

absl::Status MoeUnpermuteBackwardCpu(const Tensor& dy, const Tensor& expert_out,
                                     const Tensor& slot_to_row,
                                     const Tensor* weights, Tensor* dexpert_out,
                                     Tensor* dweights) {
  const int64_t rows = expert_out.size(0), h = expert_out.size(1);
  const int64_t tokens = dy.size(0);
  MCC_RETURN_IF_ERROR(
      CheckValues("MoeUnpermuteBackward", "slot_to_row", slot_to_row, rows));
  if (tokens == 0) return absl::OkStatus();
  const int64_t k = rows / tokens;
  const int32_t* s2r = slot_to_row.data<int32_t>();
  const float* w = weights ? weights->data<float>() : nullptr;
  float* dw = dweights ? dweights->data<float>() : nullptr;
  DispatchFloat(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* dyp = dy.data<T>();
    const T* out = expert_out.data<T>();
    T* dout = dexpert_out->data<T>();
    ParallelForRows(tokens, h, [&](int64_t t0, int64_t t1) {
      std::vector<float> g(h), row(h), scaled(h);
      for (int64_t t = t0; t < t1; ++t) {
        LoadF32(dyp + t * h, g.data(), h);
        for (int64_t i = 0; i < k; ++i) {
          const int64_t s = t * k + i, r = s2r[s];
          const float ws = w ? w[s] : 1.0f;
          for (int64_t j = 0; j < h; ++j) scaled[j] = ws * g[j];
          StoreF32(scaled.data(), dout + r * h, h);
          if (dw != nullptr) {
            LoadF32(out + r * h, row.data(), h);
            double dot = 0.0;
            for (int64_t j = 0; j < h; ++j) {
              dot += static_cast<double>(g[j]) * row[j];
            }
            dw[s] = static_cast<float>(dot);
          }
        }
      }
    });
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeSortTokens(const Tensor& indices, int64_t num_experts,
                           Tensor* row_to_slot, Tensor* slot_to_row,
                           Tensor* tokens_per_expert) {
  ScopedOpTimer op_timer("MoeSortTokens");
  const char* op = "MoeSortTokens";
  MCC_RETURN_IF_ERROR(
      CheckDefined(op, {{"indices", &indices},
                        {"row_to_slot", row_to_slot},
                        {"slot_to_row", slot_to_row},
                        {"tokens_per_expert", tokens_per_expert}}));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"indices", &indices},
                           {"row_to_slot", row_to_slot},
                           {"slot_to_row", slot_to_row},
                           {"tokens_per_expert", tokens_per_expert}}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"indices", &indices}, DType::kInt32));
  if (indices.dim() != 2) {
    return Fail(
        op, absl::StrCat("indices ", Brief(indices), " must be [tokens, k]"));
  }
  if (num_experts < 1) {
    return Fail(
        op, absl::StrCat("num_experts ", num_experts, " must be at least 1"));
  }
  const int64_t slots = indices.numel();
  MCC_RETURN_IF_ERROR(
      CheckIndexVector(op, {"row_to_slot", row_to_slot}, slots));
  MCC_RETURN_IF_ERROR(
      CheckIndexVector(op, {"slot_to_row", slot_to_row}, slots));
  MCC_RETURN_IF_ERROR(
      CheckDType(op, {"tokens_per_expert", tokens_per_expert}, DType::kInt64));
  if (tokens_per_expert->shape() != Shape{num_experts}) {
    return Fail(op,
                absl::StrCat("tokens_per_expert ", Brief(*tokens_per_expert),
                             " must be [", num_experts, "]"));
  }
  return MoeSortTokensKernels()(indices.device(), indices, num_experts,
                                row_to_slot, slot_to_row, tokens_per_expert);
}

absl::Status MoePermute(const Tensor& x, const Tensor& row_to_slot,
                        Tensor* permuted) {
  ScopedOpTimer op_timer("MoePermute");
  const char* op = "MoePermute";
  MCC_RETURN_IF_ERROR(CheckDefined(
      op, {{"x", &x}, {"row_to_slot", &row_to_slot}, {"permuted", permuted}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(
      op, {{"x", &x}, {"row_to_slot", &row_to_slot}, {"permuted", permuted}}));
  MCC_RETURN_IF_ERROR(CheckRows(op, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckRows(op, {"permuted", permuted}));
  MCC_RETURN_IF_ERROR(CheckSameDType(op, {"x", &x}, {"permuted", permuted}));
  if (permuted->size(1) != x.size(1)) {
    return Fail(op, absl::StrCat("x ", Brief(x), " and permuted ",
                                 Brief(*permuted), " differ in hidden size"));
  }
  MCC_RETURN_IF_ERROR(CheckCopies(op, x.size(0), permuted->size(0)));
  MCC_RETURN_IF_ERROR(
      CheckIndexVector(op, {"row_to_slot", &row_to_slot}, permuted->size(0)));
  return MoePermuteKernels()(x.device(), x, row_to_slot, permuted);
}

absl::Status MoeUnpermute(const Tensor& expert_out, const Tensor& slot_to_row,
                          const Tensor* weights, Tensor* y) {
  ScopedOpTimer op_timer("MoeUnpermute");
  const char* op = "MoeUnpermute";
  MCC_RETURN_IF_ERROR(CheckDefined(
      op,
      {{"expert_out", &expert_out}, {"slot_to_row", &slot_to_row}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(
      op,
      {{"expert_out", &expert_out}, {"slot_to_row", &slot_to_row}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckRows(op, {"expert_out", &expert_out}));
  MCC_RETURN_IF_ERROR(CheckRows(op, {"y", y}));
  MCC_RETURN_IF_ERROR(
      CheckSameDType(op, {"expert_out", &expert_out}, {"y", y}));
  if (y->size(1) != expert_out.size(1)) {
    return Fail(op, absl::StrCat("expert_out ", Brief(expert_out), " and y ",
                                 Brief(*y), " differ in hidden size"));
  }
  const int64_t tokens = y->size(0), rows = expert_out.size(0);
  MCC_RETURN_IF_ERROR(CheckCopies(op, tokens, rows));
  MCC_RETURN_IF_ERROR(
      CheckIndexVector(op, {"slot_to_row", &slot_to_row}, rows));
  if (weights != nullptr) {
    MCC_RETURN_IF_ERROR(CheckDefined(op, {{"weights", weights}}));
    MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"y", y}, {"weights", weights}}));
    MCC_RETURN_IF_ERROR(CheckDType(op, {"weights", weights}, DType::kFloat32));
    if (weights->numel() != rows || weights->dim() != 2 ||
        weights->size(0) != tokens) {
      return Fail(op, absl::StrCat("weights ", Brief(*weights), " must be [",
                                   tokens, ", k] with ", rows, " entries"));
    }
  }
  return MoeUnpermuteKernels()(y->device(), expert_out, slot_to_row, weights,
                               y);
}

absl::Status MoePermuteBackward(const Tensor& dpermuted,
                                const Tensor& slot_to_row, Tensor* dx) {
  return MoeUnpermute(dpermuted, slot_to_row, nullptr, dx);
}

absl::Status MoeUnpermuteBackward(const Tensor& dy, const Tensor& expert_out,
                                  const Tensor& slot_to_row,
                                  const Tensor* weights, Tensor* dexpert_out,
                                  Tensor* dweights) {
  ScopedOpTimer op_timer("MoeUnpermuteBackward");
  const char* op = "MoeUnpermuteBackward";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"dy", &dy},
                                        {"expert_out", &expert_out},
                                        {"slot_to_row", &slot_to_row},
                                        {"dexpert_out", dexpert_out}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"dy", &dy},
                                           {"expert_out", &expert_out},
                                           {"slot_to_row", &slot_to_row},
                                           {"dexpert_out", dexpert_out}}));
  MCC_RETURN_IF_ERROR(CheckRows(op, {"dy", &dy}));
  MCC_RETURN_IF_ERROR(CheckRows(op, {"expert_out", &expert_out}));
  MCC_RETURN_IF_ERROR(
      CheckSameDType(op, {"dy", &dy}, {"expert_out", &expert_out}));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"expert_out", &expert_out},
                                        {"dexpert_out", dexpert_out}));
  MCC_RETURN_IF_ERROR(CheckSameDType(op, {"expert_out", &expert_out},
                                     {"dexpert_out", dexpert_out}));
  if (dy.size(1) != expert_out.size(1)) {
    return Fail(op, absl::StrCat("dy ", Brief(dy), " and expert_out ",
                                 Brief(expert_out), " differ in hidden size"));
  }
  const int64_t tokens = dy.size(0), rows = expert_out.size(0);
  MCC_RETURN_IF_ERROR(CheckCopies(op, tokens, rows));
  MCC_RETURN_IF_ERROR(
      CheckIndexVector(op, {"slot_to_row", &slot_to_row}, rows));
  if ((weights == nullptr) != (dweights == nullptr)) {
    return Fail(op, "weights and dweights must be given together");
  }
  if (weights != nullptr) {
    MCC_RETURN_IF_ERROR(
        CheckDefined(op, {{"weights", weights}, {"dweights", dweights}}));
    MCC_RETURN_IF_ERROR(CheckSameDevice(
        op, {{"dy", &dy}, {"weights", weights}, {"dweights", dweights}}));
    MCC_RETURN_IF_ERROR(CheckDType(op, {"weights", weights}, DType::kFloat32));
    if (weights->numel() != rows || weights->dim() != 2 ||
        weights->size(0) != tokens) {
      return Fail(op, absl::StrCat("weights ", Brief(*weights), " must be [",
                                   tokens, ", k] with ", rows, " entries"));
    }
    MCC_RETURN_IF_ERROR(
        CheckDType(op, {"dweights", dweights}, DType::kFloat32));
    MCC_RETURN_IF_ERROR(
        CheckShapeMatches(op, {"weights", weights}, {"dweights", dweights}));
  }
  return MoeUnpermuteBackwardKernels()(dy.device(), dy, expert_out, slot_to_row,
                                       weights, dexpert_out, dweights);
}

MCC_KERNEL_SLOT(MoeSortTokensKernel, MoeSortTokensKernels, "MoeSortTokens",
                &MoeSortTokensCpu);
MCC_KERNEL_SLOT(MoePermuteKernel, MoePermuteKernels, "MoePermute",
                &MoePermuteCpu);
MCC_KERNEL_SLOT(MoeUnpermuteKernel, MoeUnpermuteKernels, "MoeUnpermute",
                &MoeUnpermuteCpu);
MCC_KERNEL_SLOT(MoeUnpermuteBackwardKernel, MoeUnpermuteBackwardKernels,
                "MoeUnpermuteBackward", &MoeUnpermuteBackwardCpu);

}  // namespace ops
}  // namespace mcc
