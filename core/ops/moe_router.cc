#include "core/ops/moe_router.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {

MoeRouterOptions SigmoidGateOptions() {
  MoeRouterOptions o;
  o.topk = 1;
  o.score_function = MoeScoreFunction::kSigmoid;
  o.normalize_topk = false;
  return o;
}

const char* MoeScoreFunctionName(MoeScoreFunction f) {
  return f == MoeScoreFunction::kSigmoid ? "sigmoid" : "softmax";
}

namespace {

// [tokens, experts] fp32.
absl::Status CheckTokenByExpert(const char* op, const Arg& arg) {
  MCC_RETURN_IF_ERROR(CheckDType(op, arg, DType::kFloat32));
  if (arg.tensor->dim() != 2 || arg.tensor->size(1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg.name, " ", Brief(*arg.tensor),
                     " must be [tokens, experts] with at least one expert"));
  }
  return absl::OkStatus();
}

// indices int32 [tokens, k] with 1 <= k <= experts.
absl::Status CheckIndices(const char* op, const Tensor& indices, int64_t tokens,
                          int64_t experts) {
  MCC_RETURN_IF_ERROR(CheckDType(op, {"indices", &indices}, DType::kInt32));
  if (indices.dim() != 2 || indices.size(0) != tokens || indices.size(1) < 1 ||
      indices.size(1) > experts) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": indices ", Brief(indices), " must be [", tokens,
                     ", k] with 1 <= k <= ", experts, " (the experts)"));
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const char* op, const Arg& arg, const Shape& shape) {
  if (arg.tensor->shape() != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg.name, " ", Brief(*arg.tensor),
                     " must have shape ", ShapeToString(shape)));
  }
  return absl::OkStatus();
}

// Expert indices are data (another kernel's output): checked before any
// output is written.
absl::Status CheckIndexValues(const char* op, const Tensor& indices,
                              int64_t experts) {
  const int32_t* idx = indices.data<int32_t>();
  for (int64_t i = 0; i < indices.numel(); ++i) {
    if (idx[i] < 0 || idx[i] >= experts) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": indices[", i / indices.size(1), ", ", i % indices.size(1),
          "] = ", idx[i], " is not an expert in [0, ", experts, ")"));
    }
  }
  return absl::OkStatus();
}

// Row-wise scores of logits, in fp32 with sums in expert order.
void ScoreRow(const float* l, int64_t e, MoeScoreFunction f, float* s) {
  if (f == MoeScoreFunction::kSigmoid) {
    for (int64_t j = 0; j < e; ++j) s[j] = 1.0f / (1.0f + std::exp(-l[j]));
    return;
  }
  float mx = l[0];
  for (int64_t j = 1; j < e; ++j) mx = std::max(mx, l[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < e; ++j) {
    s[j] = std::exp(l[j] - mx);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < e; ++j) s[j] *= inv;
}

// dl = J^T ds for the score function at scores s (one token's row).
void ScoreBackwardRow(const float* s, const float* ds, int64_t e,
                      MoeScoreFunction f, float* dl, bool accumulate) {
  if (f == MoeScoreFunction::kSigmoid) {
    for (int64_t j = 0; j < e; ++j) {
      const float g = ds[j] * s[j] * (1.0f - s[j]);
      dl[j] = accumulate ? dl[j] + g : g;
    }
    return;
  }
  float dot = 0.0f;
  for (int64_t j = 0; j < e; ++j) dot += s[j] * ds[j];
  for (int64_t j = 0; j < e; ++j) {
    const float g = s[j] * (ds[j] - dot);
    dl[j] = accumulate ? dl[j] + g : g;
  }
}

void ParallelForTokens(int64_t tokens, int64_t experts,
                       const std::function<void(int64_t, int64_t)>& fn) {
  ThreadPool::Global().ParallelFor(
      tokens, std::max<int64_t>(1, kGrain / (8 * experts + 1)), fn);
}

absl::Status MoeRouterForwardCpu(const Tensor& logits, const Tensor* bias,
                                 const MoeRouterOptions& options,
                                 Tensor* scores, Tensor* indices,
                                 Tensor* weights) {
  const int64_t t = logits.size(0), e = logits.size(1), k = options.topk;
  const float* lp = logits.data<float>();
  const float* bp = bias ? bias->data<float>() : nullptr;
  float* sp = scores->data<float>();
  int32_t* ip = indices->data<int32_t>();
  float* wp = weights->data<float>();
  ParallelForTokens(t, e, [&](int64_t t0, int64_t t1) {
    std::vector<float> value(e);
    std::vector<char> taken(e);
    for (int64_t r = t0; r < t1; ++r) {
      float* s = sp + r * e;
      ScoreRow(lp + r * e, e, options.score_function, s);
      for (int64_t j = 0; j < e; ++j) value[j] = bp ? s[j] + bp[j] : s[j];
      std::fill(taken.begin(), taken.end(), 0);
      int32_t* idx = ip + r * k;
      for (int64_t i = 0; i < k; ++i) {
        // Strictly greater: among equal values the lower index wins.
        int64_t best = -1;
        for (int64_t j = 0; j < e; ++j) {
          if (taken[j]) continue;
          if (best < 0 || value[j] > value[best]) best = j;
        }
        taken[best] = 1;
        idx[i] = static_cast<int32_t>(best);
      }
      float* w = wp + r * k;
      float denom = 1.0f;
      if (options.normalize_topk) {
        denom = 0.0f;
        for (int64_t i = 0; i < k; ++i) denom += s[idx[i]];
      }
      for (int64_t i = 0; i < k; ++i) {
        w[i] = options.scaling_factor * s[idx[i]] / denom;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status MoeRouterBackwardCpu(const Tensor& scores, const Tensor& indices,
                                  const Tensor& dweights,
                                  const MoeRouterOptions& options,
                                  Tensor* dlogits) {
  const int64_t t = scores.size(0), e = scores.size(1), k = indices.size(1);
  MCC_RETURN_IF_ERROR(CheckIndexValues("MoeRouterBackward", indices, e));
  const float* sp = scores.data<float>();
  const int32_t* ip = indices.data<int32_t>();
  const float* dwp = dweights.data<float>();
  float* dlp = dlogits->data<float>();
  const float c = options.scaling_factor;
  ParallelForTokens(t, e, [&](int64_t t0, int64_t t1) {
    std::vector<float> ds(e);
    for (int64_t r = t0; r < t1; ++r) {
      const float* s = sp + r * e;
      const int32_t* idx = ip + r * k;
      const float* dw = dwp + r * k;
      std::fill(ds.begin(), ds.end(), 0.0f);
      if (options.normalize_topk) {
        // w_i = c s_i / S: dL/ds_m = c (dw_m S - sum_i dw_i s_i) / S^2.
        float sum = 0.0f, dot = 0.0f;
        for (int64_t i = 0; i < k; ++i) {
          sum += s[idx[i]];
          dot += dw[i] * s[idx[i]];
        }
        for (int64_t i = 0; i < k; ++i) {
          ds[idx[i]] += c * (dw[i] * sum - dot) / (sum * sum);
        }
      } else {
        for (int64_t i = 0; i < k; ++i) ds[idx[i]] += c * dw[i];
      }
      ScoreBackwardRow(s, ds.data(), e, options.score_function, dlp + r * e,
                       /*accumulate=*/false);
    }
  });
  return absl::OkStatus();
}

// The balancing loss's probabilities for one token: the scores (softmax) or
// the scores normalised over every expert (sigmoid); returns the
// normaliser (1 for softmax).
float AuxProbsRow(const float* s, int64_t e, MoeScoreFunction f, float* p) {
  if (f == MoeScoreFunction::kSoftmax) {
    std::copy(s, s + e, p);
    return 1.0f;
  }
  float z = 0.0f;
  for (int64_t j = 0; j < e; ++j) z += s[j];
  z += 1e-20f;
  for (int64_t j = 0; j < e; ++j) p[j] = s[j] / z;
  return z;
}

// Per sequence (token t in sequence t % sequences): the routed counts per
// expert.
std::vector<int64_t> SequenceCounts(const Tensor& indices, int64_t experts,
                                    int64_t sequences) {
  const int64_t t = indices.size(0), k = indices.size(1);
  const int32_t* ip = indices.data<int32_t>();
  std::vector<int64_t> counts(sequences * experts, 0);
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      ++counts[(r % sequences) * experts + ip[r * k + i]];
    }
  }
  return counts;
}

// The counts f_e is made of, per sequence: the whole sequences' (totals)
// or this rank's.
std::vector<int64_t> BalanceCounts(const Tensor& indices, int64_t experts,
                                   int64_t sequences,
                                   const MoeSequenceTotals& totals) {
  if (totals.counts == nullptr) {
    return SequenceCounts(indices, experts, sequences);
  }
  const int64_t* c = totals.counts->data<int64_t>();
  return std::vector<int64_t>(c, c + sequences * experts);
}

absl::Status MoeLoadBalancingLossCpu(const Tensor& scores,
                                     const Tensor& indices, MoeScoreFunction f,
                                     int64_t sequences, float coeff,
                                     Tensor* loss,
                                     const MoeSequenceTotals& totals) {
  const int64_t t = scores.size(0), e = scores.size(1), k = indices.size(1);
  MCC_RETURN_IF_ERROR(CheckIndexValues("MoeLoadBalancingLoss", indices, e));
  const int64_t len = totals.length > 0 ? totals.length : t / sequences;
  const std::vector<int64_t> counts =
      BalanceCounts(indices, e, sequences, totals);
  const float* sp = scores.data<float>();
  std::vector<float> p(e);
  std::vector<double> psum(sequences * e, 0.0);
  for (int64_t r = 0; r < t; ++r) {
    AuxProbsRow(sp + r * e, e, f, p.data());
    double* ps = psum.data() + (r % sequences) * e;
    for (int64_t j = 0; j < e; ++j) ps[j] += p[j];
  }
  double total = 0.0;
  for (int64_t g = 0; g < sequences; ++g) {
    double run = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      run += static_cast<double>(counts[g * e + j]) / (len * k) *
             (psum[g * e + j] / len);
    }
    total += e * run;
  }
  loss->data<float>()[0] = static_cast<float>(coeff * total / sequences);
  return absl::OkStatus();
}

absl::Status MoeLoadBalancingLossBackwardCpu(const Tensor& scores,
                                             const Tensor& indices,
                                             MoeScoreFunction f,
                                             int64_t sequences, float coeff,
                                             float grad_scale, Tensor* dlogits,
                                             const MoeSequenceTotals& totals) {
  const int64_t t = scores.size(0), e = scores.size(1), k = indices.size(1);
  MCC_RETURN_IF_ERROR(
      CheckIndexValues("MoeLoadBalancingLossBackward", indices, e));
  const int64_t len = totals.length > 0 ? totals.length : t / sequences;
  const std::vector<int64_t> counts =
      BalanceCounts(indices, e, sequences, totals);
  // dL/dp_te = grad_scale * coeff * E * f_e / (len * sequences).
  std::vector<float> dp(sequences * e);
  for (int64_t g = 0; g < sequences; ++g) {
    for (int64_t j = 0; j < e; ++j) {
      const double fe = static_cast<double>(counts[g * e + j]) / (len * k);
      dp[g * e + j] = static_cast<float>(static_cast<double>(grad_scale) *
                                         coeff * e * fe / (len * sequences));
    }
  }
  const float* sp = scores.data<float>();
  float* dlp = dlogits->data<float>();
  ParallelForTokens(t, e, [&](int64_t t0, int64_t t1) {
    std::vector<float> p(e), ds(e);
    for (int64_t r = t0; r < t1; ++r) {
      const float* s = sp + r * e;
      const float* g = dp.data() + (r % sequences) * e;
      if (f == MoeScoreFunction::kSoftmax) {
        ScoreBackwardRow(s, g, e, f, dlp + r * e, /*accumulate=*/true);
        continue;
      }
      // p = s / z: ds_j = (g_j - sum_i p_i g_i) / z.
      const float z = AuxProbsRow(s, e, f, p.data());
      float dot = 0.0f;
      for (int64_t j = 0; j < e; ++j) dot += p[j] * g[j];
      for (int64_t j = 0; j < e; ++j) ds[j] = (g[j] - dot) / z;
      ScoreBackwardRow(s, ds.data(), e, f, dlp + r * e, /*accumulate=*/true);
    }
  });
  return absl::OkStatus();
}

// logsumexp of one row, in float64.
double LogSumExpRow(const float* l, int64_t e) {
  double mx = l[0];
  for (int64_t j = 1; j < e; ++j) mx = std::max<double>(mx, l[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < e; ++j) sum += std::exp(l[j] - mx);
  return mx + std::log(sum);
}

absl::Status MoeZLossCpu(const Tensor& logits, float coeff, Tensor* loss) {
  const int64_t t = logits.size(0), e = logits.size(1);
  const float* lp = logits.data<float>();
  double sum = 0.0;
  for (int64_t r = 0; r < t; ++r) {
    const double lse = LogSumExpRow(lp + r * e, e);
    sum += lse * lse;
  }
  loss->data<float>()[0] = static_cast<float>(t > 0 ? coeff * sum / t : 0.0);
  return absl::OkStatus();
}

absl::Status MoeZLossBackwardCpu(const Tensor& logits, float coeff,
                                 float grad_scale, Tensor* dlogits) {
  const int64_t t = logits.size(0), e = logits.size(1);
  const float* lp = logits.data<float>();
  float* dlp = dlogits->data<float>();
  ParallelForTokens(t, e, [&](int64_t t0, int64_t t1) {
    for (int64_t r = t0; r < t1; ++r) {
      const float* l = lp + r * e;
      const double lse = LogSumExpRow(l, e);
      // d(lse^2)/dl_j = 2 lse softmax_j.
      const double scale =
          static_cast<double>(grad_scale) * coeff * 2.0 * lse / t;
      float* dl = dlp + r * e;
      for (int64_t j = 0; j < e; ++j) {
        dl[j] += static_cast<float>(scale * std::exp(l[j] - lse));
      }
    }
  });
  return absl::OkStatus();
}

absl::Status MoeUpdateExpertBiasCpu(const Tensor& tokens_per_expert, float rate,
                                    Tensor* expert_bias) {
  const int64_t e = tokens_per_expert.numel();
  const int64_t* n = tokens_per_expert.data<int64_t>();
  float* b = expert_bias->data<float>();
  int64_t total = 0;
  for (int64_t j = 0; j < e; ++j) total += n[j];
  const double mean = static_cast<double>(total) / e;
  for (int64_t j = 0; j < e; ++j) {
    const double offset = mean - static_cast<double>(n[j]);
    b[j] += offset > 0 ? rate : (offset < 0 ? -rate : 0.0f);
  }
  return absl::OkStatus();
}

absl::Status CheckSequences(const char* op, int64_t tokens, int64_t sequences) {
  if (sequences < 1 || tokens % sequences != 0 || tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", tokens, " tokens do not split into ", sequences,
                     " sequences of equal, non-zero length"));
  }
  return absl::OkStatus();
}

// The totals, when given: counts int64 [sequences, E] on the scores'
// device, a length of at least this rank's tokens per sequence.
absl::Status CheckTotals(const char* op, const Tensor& scores,
                         int64_t sequences, const MoeSequenceTotals& totals) {
  const int64_t local = scores.size(0) / sequences;
  if (totals.length != 0 && totals.length < local) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": whole sequence length ", totals.length,
                     " is below this rank's ", local, " tokens per sequence"));
  }
  if (totals.counts == nullptr) return absl::OkStatus();
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"totals.counts", totals.counts}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(
      op, {{"scores", &scores}, {"totals.counts", totals.counts}}));
  MCC_RETURN_IF_ERROR(
      CheckDType(op, {"totals.counts", totals.counts}, DType::kInt64));
  return CheckShape(op, {"totals.counts", totals.counts},
                    {sequences, scores.size(1)});
}

}  // namespace

absl::Status MoeRouterForward(const Tensor& logits, const Tensor* expert_bias,
                              const MoeRouterOptions& options, Tensor* scores,
                              Tensor* indices, Tensor* weights) {
  ScopedOpTimer op_timer("MoeRouterForward");
  const char* op = "MoeRouterForward";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"logits", &logits},
                                        {"scores", scores},
                                        {"indices", indices},
                                        {"weights", weights}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"logits", &logits},
                                           {"scores", scores},
                                           {"indices", indices},
                                           {"weights", weights}}));
  MCC_RETURN_IF_ERROR(CheckTokenByExpert(op, {"logits", &logits}));
  const int64_t t = logits.size(0), e = logits.size(1), k = options.topk;
  if (k < 1 || k > e) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": topk ", k, " must be in [1, ", e, "] (the experts)"));
  }
  if (expert_bias != nullptr) {
    MCC_RETURN_IF_ERROR(CheckDefined(op, {{"expert_bias", expert_bias}}));
    MCC_RETURN_IF_ERROR(CheckSameDevice(
        op, {{"logits", &logits}, {"expert_bias", expert_bias}}));
    MCC_RETURN_IF_ERROR(
        CheckDType(op, {"expert_bias", expert_bias}, DType::kFloat32));
    MCC_RETURN_IF_ERROR(CheckShape(op, {"expert_bias", expert_bias}, {e}));
  }
  MCC_RETURN_IF_ERROR(CheckTokenByExpert(op, {"scores", scores}));
  MCC_RETURN_IF_ERROR(CheckShape(op, {"scores", scores}, {t, e}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"indices", indices}, DType::kInt32));
  MCC_RETURN_IF_ERROR(CheckShape(op, {"indices", indices}, {t, k}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"weights", weights}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckShape(op, {"weights", weights}, {t, k}));
  return MoeRouterForwardKernels()(logits.device(), logits, expert_bias,
                                   options, scores, indices, weights);
}

absl::Status MoeRouterBackward(const Tensor& scores, const Tensor& indices,
                               const Tensor& dweights,
                               const MoeRouterOptions& options,
                               Tensor* dlogits) {
  ScopedOpTimer op_timer("MoeRouterBackward");
  const char* op = "MoeRouterBackward";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"scores", &scores},
                                        {"indices", &indices},
                                        {"dweights", &dweights},
                                        {"dlogits", dlogits}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"scores", &scores},
                                           {"indices", &indices},
                                           {"dweights", &dweights},
                                           {"dlogits", dlogits}}));
  MCC_RETURN_IF_ERROR(CheckTokenByExpert(op, {"scores", &scores}));
  const int64_t t = scores.size(0), e = scores.size(1);
  MCC_RETURN_IF_ERROR(CheckIndices(op, indices, t, e));
  if (indices.size(1) != options.topk) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": indices ", Brief(indices), " do not hold topk ",
                     options.topk, " experts per token"));
  }
  MCC_RETURN_IF_ERROR(CheckDType(op, {"dweights", &dweights}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckShape(op, {"dweights", &dweights}, indices.shape()));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"dlogits", dlogits}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckShape(op, {"dlogits", dlogits}, {t, e}));
  return MoeRouterBackwardKernels()(scores.device(), scores, indices, dweights,
                                    options, dlogits);
}

absl::Status MoeLoadBalancingLoss(const Tensor& scores, const Tensor& indices,
                                  MoeScoreFunction score_function,
                                  int64_t sequences, float coeff, Tensor* loss,
                                  const MoeSequenceTotals& totals) {
  ScopedOpTimer op_timer("MoeLoadBalancingLoss");
  const char* op = "MoeLoadBalancingLoss";
  MCC_RETURN_IF_ERROR(CheckDefined(
      op, {{"scores", &scores}, {"indices", &indices}, {"loss", loss}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(
      op, {{"scores", &scores}, {"indices", &indices}, {"loss", loss}}));
  MCC_RETURN_IF_ERROR(CheckTokenByExpert(op, {"scores", &scores}));
  MCC_RETURN_IF_ERROR(
      CheckIndices(op, indices, scores.size(0), scores.size(1)));
  MCC_RETURN_IF_ERROR(CheckSequences(op, scores.size(0), sequences));
  MCC_RETURN_IF_ERROR(CheckTotals(op, scores, sequences, totals));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"loss", loss}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckShape(op, {"loss", loss}, {1}));
  return MoeLoadBalancingLossKernels()(scores.device(), scores, indices,
                                       score_function, sequences, coeff, loss,
                                       totals);
}

absl::Status MoeLoadBalancingLossBackward(const Tensor& scores,
                                          const Tensor& indices,
                                          MoeScoreFunction score_function,
                                          int64_t sequences, float coeff,
                                          float grad_scale, Tensor* dlogits,
                                          const MoeSequenceTotals& totals) {
  ScopedOpTimer op_timer("MoeLoadBalancingLossBackward");
  const char* op = "MoeLoadBalancingLossBackward";
  MCC_RETURN_IF_ERROR(CheckDefined(
      op, {{"scores", &scores}, {"indices", &indices}, {"dlogits", dlogits}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(
      op, {{"scores", &scores}, {"indices", &indices}, {"dlogits", dlogits}}));
  MCC_RETURN_IF_ERROR(CheckTokenByExpert(op, {"scores", &scores}));
  MCC_RETURN_IF_ERROR(
      CheckIndices(op, indices, scores.size(0), scores.size(1)));
  MCC_RETURN_IF_ERROR(CheckSequences(op, scores.size(0), sequences));
  MCC_RETURN_IF_ERROR(CheckTotals(op, scores, sequences, totals));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"dlogits", dlogits}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckShape(op, {"dlogits", dlogits}, scores.shape()));
  return MoeLoadBalancingLossBackwardKernels()(scores.device(), scores, indices,
                                               score_function, sequences, coeff,
                                               grad_scale, dlogits, totals);
}

absl::Status MoeZLoss(const Tensor& logits, float coeff, Tensor* loss) {
  ScopedOpTimer op_timer("MoeZLoss");
  const char* op = "MoeZLoss";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"logits", &logits}, {"loss", loss}}));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"logits", &logits}, {"loss", loss}}));
  MCC_RETURN_IF_ERROR(CheckTokenByExpert(op, {"logits", &logits}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"loss", loss}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckShape(op, {"loss", loss}, {1}));
  return MoeZLossKernels()(logits.device(), logits, coeff, loss);
}

absl::Status MoeZLossBackward(const Tensor& logits, float coeff,
                              float grad_scale, Tensor* dlogits) {
  ScopedOpTimer op_timer("MoeZLossBackward");
  const char* op = "MoeZLossBackward";
  MCC_RETURN_IF_ERROR(
      CheckDefined(op, {{"logits", &logits}, {"dlogits", dlogits}}));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"logits", &logits}, {"dlogits", dlogits}}));
  MCC_RETURN_IF_ERROR(CheckTokenByExpert(op, {"logits", &logits}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"dlogits", dlogits}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckShape(op, {"dlogits", dlogits}, logits.shape()));
  return MoeZLossBackwardKernels()(logits.device(), logits, coeff, grad_scale,
                                   dlogits);
}

absl::Status MoeUpdateExpertBias(const Tensor& tokens_per_expert, float rate,
                                 Tensor* expert_bias) {
  ScopedOpTimer op_timer("MoeUpdateExpertBias");
  const char* op = "MoeUpdateExpertBias";
  MCC_RETURN_IF_ERROR(
      CheckDefined(op, {{"tokens_per_expert", &tokens_per_expert},
                        {"expert_bias", expert_bias}}));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"tokens_per_expert", &tokens_per_expert},
                           {"expert_bias", expert_bias}}));
  MCC_RETURN_IF_ERROR(
      CheckDType(op, {"tokens_per_expert", &tokens_per_expert}, DType::kInt64));
  MCC_RETURN_IF_ERROR(
      CheckDType(op, {"expert_bias", expert_bias}, DType::kFloat32));
  if (tokens_per_expert.dim() != 1 || tokens_per_expert.numel() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": tokens_per_expert ",
                                                   Brief(tokens_per_expert),
                                                   " must be [experts]"));
  }
  MCC_RETURN_IF_ERROR(
      CheckShape(op, {"expert_bias", expert_bias}, tokens_per_expert.shape()));
  return MoeUpdateExpertBiasKernels()(tokens_per_expert.device(),
                                      tokens_per_expert, rate, expert_bias);
}

MCC_KERNEL_SLOT(MoeRouterForwardKernel, MoeRouterForwardKernels,
                "MoeRouterForward", &MoeRouterForwardCpu);
MCC_KERNEL_SLOT(MoeRouterBackwardKernel, MoeRouterBackwardKernels,
                "MoeRouterBackward", &MoeRouterBackwardCpu);
MCC_KERNEL_SLOT(MoeLoadBalancingLossKernel, MoeLoadBalancingLossKernels,
                "MoeLoadBalancingLoss", &MoeLoadBalancingLossCpu);
MCC_KERNEL_SLOT(MoeLoadBalancingLossBackwardKernel,
                MoeLoadBalancingLossBackwardKernels,
                "MoeLoadBalancingLossBackward",
                &MoeLoadBalancingLossBackwardCpu);
MCC_KERNEL_SLOT(MoeZLossKernel, MoeZLossKernels, "MoeZLoss", &MoeZLossCpu);
MCC_KERNEL_SLOT(MoeZLossBackwardKernel, MoeZLossBackwardKernels,
                "MoeZLossBackward", &MoeZLossBackwardCpu);
MCC_KERNEL_SLOT(MoeUpdateExpertBiasKernel, MoeUpdateExpertBiasKernels,
                "MoeUpdateExpertBias", &MoeUpdateExpertBiasCpu);

}  // namespace ops
}  // namespace mcc
