#include "inference/model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/ops/activation.h"
#include "core/ops/moe_router.h"
#include "core/ops/rotary.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "inference/device_step.h"
#include "inference/paged_attention.h"
#include "inference/row_gemm.h"

namespace mcc {
namespace inference {
namespace {

Tensor HostTensor(std::vector<float>* v) {
  return Tensor::FromExternal(v->data(), {static_cast<int64_t>(v->size())},
                              DType::kFloat32, Device::CPU(), nullptr);
}

// *v sized n, its capacity kept between steps: a step then reuses memory
// instead of mapping (and faulting in) fresh pages for every activation,
// which cost more than the step's arithmetic on these VMs at 32+ rows. The
// contents are stale; every user overwrites them whole.
std::vector<float>& Buffer(std::vector<float>* v, int64_t n) {
  v->resize(n);
  return *v;
}

// lin's weights (fp32 or int8) packed for RowGemm.
RowGemmWeights PackLinear(const LinearWeights& lin) {
  return lin.q.empty()
             ? RowGemmWeights::Pack(lin.weight.data(), lin.out, lin.in)
             : RowGemmWeights::PackInt8(lin.q.data(), lin.scales.data(),
                                        lin.out, lin.in);
}

// y = x W^T (+ bias) for x [rows, lin.in], W packed from lin.
void Apply(const LinearWeights& lin, const RowGemmWeights& packed,
           const float* x, int64_t rows, float* y, bool add_bias) {
  RowGemm(x, rows, packed, y);
  if (add_bias && !lin.bias.empty()) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < lin.out; ++c) y[r * lin.out + c] += lin.bias[c];
    }
  }
}

}  // namespace

KvCacheShape CacheShapeFor(const InferenceWeights& weights,
                           int64_t block_size) {
  KvCacheShape shape;
  shape.num_layers = static_cast<int64_t>(weights.layers.size());
  shape.kv_heads = weights.local_groups;
  shape.head_dim = weights.config.head_dim();
  shape.block_size = block_size;
  return shape;
}

ModelRunner::ModelRunner(InferenceWeights weights, comm::ProcessGroup* tp,
                         PagedKvCache cache)
    : weights_(std::move(weights)), tp_(tp), cache_(std::move(cache)) {
  const gpt::GPTConfig& c = weights_.config;
  for (LayerWeights& lw : weights_.layers) {
    PackedLayer pl;
    pl.qkv = PackLinear(lw.qkv);
    pl.proj = PackLinear(lw.proj);
    std::vector<LinearWeights*> packed = {&lw.qkv, &lw.proj};
    if (lw.is_moe()) {
      MoeWeights& m = lw.moe;
      pl.router = RowGemmWeights::Pack(
          m.router_weight.data(),
          static_cast<int64_t>(m.router_weight.size()) / c.hidden_size,
          c.hidden_size);
      for (size_t e = 0; e < m.fc1.size(); ++e) {
        pl.expert_fc1.push_back(PackLinear(m.fc1[e]));
        pl.expert_fc2.push_back(PackLinear(m.fc2[e]));
        packed.push_back(&m.fc1[e]);
        packed.push_back(&m.fc2[e]);
      }
      if (m.shared_fc1.out > 0) {
        pl.shared_fc1 = PackLinear(m.shared_fc1);
        pl.shared_fc2 = PackLinear(m.shared_fc2);
        packed.push_back(&m.shared_fc1);
        packed.push_back(&m.shared_fc2);
      }
    } else {
      pl.fc1 = PackLinear(lw.fc1);
      pl.fc2 = PackLinear(lw.fc2);
      packed.push_back(&lw.fc1);
      packed.push_back(&lw.fc2);
    }
    packed_.push_back(std::move(pl));
    // Only the packed copy is used: free the other (shapes, scales and
    // biases stay).
    for (LinearWeights* lin : packed) {
      std::vector<float>().swap(lin->weight);
      std::vector<int8_t>().swap(lin->q);
      std::vector<int8_t>().swap(lin->fp8_codes);
    }
  }
  if (weights_.post_process && weights_.vocab_rows > 0) {
    packed_head_ = RowGemmWeights::Pack(weights_.head().data(),
                                        weights_.vocab_rows, c.hidden_size);
    // One copy: the output layer lives packed only; tied embeddings too,
    // Embed then reading its rows back from the panels.
    std::vector<float>().swap(weights_.output.empty() ? weights_.word_embeddings
                                                      : weights_.output);
  }
  if (c.position_embedding == gpt::PositionEmbedding::kRope) {
    const int64_t d = c.head_dim(), half = d / 2, n = c.max_positions();
    cos_.resize(n * half);
    sin_.resize(n * half);
    // The training model's frequencies (Llama 3 scaling included).
    const std::vector<double> inv_freq =
        ops::RotaryInverseFrequencies(c.Rotary(), d);
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t p = 0; p < n; ++p) {
        cos_[p * half + i] = static_cast<float>(std::cos(p * inv_freq[i]));
        sin_[p * half + i] = static_cast<float>(std::sin(p * inv_freq[i]));
      }
    }
  }
}

ModelRunner::ModelRunner(InferenceWeights weights,
                         std::unique_ptr<DeviceStep> device, PagedKvCache cache)
    : weights_(std::move(weights)),
      tp_(nullptr),
      cache_(std::move(cache)),
      device_(std::move(device)) {
  // The device holds the values: keep shapes, norms and biases only.
  for (LayerWeights& lw : weights_.layers) {
    for (LinearWeights* lin : {&lw.qkv, &lw.proj, &lw.fc1, &lw.fc2}) {
      std::vector<float>().swap(lin->weight);
      std::vector<int8_t>().swap(lin->q);
      std::vector<int8_t>().swap(lin->fp8_codes);
    }
  }
  std::vector<float>().swap(weights_.word_embeddings);
  std::vector<float>().swap(weights_.output);
}

ModelRunner::~ModelRunner() = default;

int64_t ModelRunner::linear_weight_bytes() const {
  if (device_ != nullptr) return device_->weight_bytes();
  int64_t bytes = 0;
  for (const PackedLayer& p : packed_) {
    bytes += p.qkv.bytes() + p.proj.bytes() + p.fc1.bytes() + p.fc2.bytes() +
             p.router.bytes() + p.shared_fc1.bytes() + p.shared_fc2.bytes();
    for (const RowGemmWeights& e : p.expert_fc1) bytes += e.bytes();
    for (const RowGemmWeights& e : p.expert_fc2) bytes += e.bytes();
  }
  return bytes;
}

absl::Status ModelRunner::SumOverTp(std::vector<float>* v) {
  if (weights_.tp_size <= 1) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(v->size());
  std::vector<float> all(n * weights_.tp_size);
  Tensor in = HostTensor(v), out = HostTensor(&all);
  MCC_RETURN_IF_ERROR(tp_->AllGatherSync(in, &out));
  for (int64_t i = 0; i < n; ++i) {
    float s = all[i];
    for (int r = 1; r < weights_.tp_size; ++r) s += all[r * n + i];
    (*v)[i] = s;
  }
  return absl::OkStatus();
}

void ModelRunner::Norm(const NormWeights& norm, const float* x, int64_t rows,
                       float* y, int64_t width) const {
  const int64_t h = width > 0 ? width : weights_.config.hidden_size;
  const float eps = static_cast<float>(weights_.config.norm_epsilon);
  const bool layer_norm = !norm.bias.empty();
  ThreadPool::Global().ParallelFor(rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * h;
      float* yr = y + r * h;
      float mean = 0;
      if (layer_norm) {
        float s = 0;
        for (int64_t i = 0; i < h; ++i) s += xr[i];
        mean = s / static_cast<float>(h);
      }
      float ss = 0;
      for (int64_t i = 0; i < h; ++i) ss += (xr[i] - mean) * (xr[i] - mean);
      const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
      for (int64_t i = 0; i < h; ++i) {
        yr[i] = (xr[i] - mean) * rstd * norm.weight[i] +
                (layer_norm ? norm.bias[i] : 0.0f);
      }
    }
  });
}

void ModelRunner::Rotate(float* x, int64_t rows, int64_t heads_per_row,
                         const std::vector<int64_t>& positions) const {
  const int64_t d = weights_.config.head_dim(), half = d / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos_.data() + positions[r] * half;
    const float* s = sin_.data() + positions[r] * half;
    for (int64_t hh = 0; hh < heads_per_row; ++hh) {
      float* v = x + (r * heads_per_row + hh) * d;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = v[i], x2 = v[half + i];
        v[i] = x1 * c[i] - x2 * s[i];
        v[half + i] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

absl::Status ModelRunner::Embed(const StepRows& rows, std::vector<float>* x) {
  const int64_t h = weights_.config.hidden_size, n = rows.rows();
  x->assign(n * h, 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = rows.tokens[r];
    if (t < 0 || t >= weights_.config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", t, " of row ", r, " is outside the vocabulary of ",
          weights_.config.vocab_size));
    }
    const int64_t local = t - weights_.vocab_start;
    if (local >= 0 && local < weights_.vocab_rows) {
      if (weights_.word_embeddings.empty()) {  // Tied, held packed.
        packed_head_.UnpackRow(local, x->data() + r * h);
      } else {
        std::memcpy(x->data() + r * h,
                    weights_.word_embeddings.data() + local * h,
                    h * sizeof(float));
      }
    }
  }
  // Exactly one rank holds each row (the others add zeros: exact).
  MCC_RETURN_IF_ERROR(SumOverTp(x));
  if (!weights_.position_embeddings.empty()) {
    for (int64_t r = 0; r < n; ++r) {
      const float* p =
          weights_.position_embeddings.data() + rows.positions[r] * h;
      for (int64_t i = 0; i < h; ++i) (*x)[r * h + i] += p[i];
    }
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::Layer(int i, const StepRows& rows,
                                const std::vector<const int32_t*>& tables,
                                std::vector<float>* x) {
  const LayerWeights& lw = weights_.layers[i];
  const PackedLayer& pl = packed_[i];
  const gpt::GPTConfig& c = weights_.config;
  const int64_t n = rows.rows(), h = c.hidden_size, d = c.head_dim();
  const int64_t groups = weights_.local_groups, heads = weights_.local_heads;
  const int64_t hpg = heads / groups;
  std::vector<float>& ln = Buffer(&scratch_.ln, n * h);
  Norm(lw.ln1, x->data(), n, ln.data());
  std::vector<float>& qkv = Buffer(&scratch_.qkv, n * lw.qkv.out);
  Apply(lw.qkv, pl.qkv, ln.data(), n, qkv.data(), true);
  std::vector<float>& q = Buffer(&scratch_.q, n * heads * d);
  std::vector<float>& k = Buffer(&scratch_.k, n * groups * d);
  std::vector<float>& v = Buffer(&scratch_.v, n * groups * d);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = qkv.data() + r * lw.qkv.out + g * (hpg + 2) * d;
      std::memcpy(q.data() + (r * heads + g * hpg) * d, src,
                  hpg * d * sizeof(float));
      std::memcpy(k.data() + (r * groups + g) * d, src + hpg * d,
                  d * sizeof(float));
      std::memcpy(v.data() + (r * groups + g) * d, src + (hpg + 1) * d,
                  d * sizeof(float));
    }
  }
  if (!lw.q_norm.weight.empty()) {  // QK-norm: per head, before rotary.
    Norm(lw.q_norm, q.data(), n * heads, q.data(), d);
    Norm(lw.k_norm, k.data(), n * groups, k.data(), d);
  }
  if (c.position_embedding == gpt::PositionEmbedding::kRope) {
    Rotate(q.data(), n, heads, rows.positions);
    Rotate(k.data(), n, groups, rows.positions);
  }
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      std::memcpy(cache_.Key(i, tables[r], rows.positions[r], g),
                  k.data() + (r * groups + g) * d, d * sizeof(float));
      std::memcpy(cache_.Value(i, tables[r], rows.positions[r], g),
                  v.data() + (r * groups + g) * d, d * sizeof(float));
    }
  }
  std::vector<float>& ctx = Buffer(&scratch_.ctx, n * heads * d);
  PagedAttention(q.data(), n, heads, rows.positions.data(), tables.data(), i,
                 &cache_, ctx.data(), c.window_left);
  std::vector<float>& attn = Buffer(&scratch_.attn, n * h);
  Apply(lw.proj, pl.proj, ctx.data(), n, attn.data(), false);
  MCC_RETURN_IF_ERROR(SumOverTp(&attn));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t e = 0; e < h; ++e) {
      (*x)[r * h + e] +=
          attn[r * h + e] + (lw.proj.bias.empty() ? 0.0f : lw.proj.bias[e]);
    }
  }
  Norm(lw.ln2, x->data(), n, ln.data());
  if (lw.is_moe()) {
    std::vector<float>& mlp = Buffer(&scratch_.mlp, n * h);
    MCC_RETURN_IF_ERROR(MoeRows(lw, pl, ln.data(), n, mlp.data()));
    for (int64_t j = 0; j < n * h; ++j) (*x)[j] += mlp[j];
    return absl::OkStatus();
  }
  std::vector<float>& fc1 = Buffer(&scratch_.fc1, n * lw.fc1.out);
  Apply(lw.fc1, pl.fc1, ln.data(), n, fc1.data(), true);
  const bool swiglu = c.activation == gpt::Activation::kSwiGLU;
  const int64_t f = swiglu ? lw.fc1.out / 2 : lw.fc1.out;
  std::vector<float>& act = Buffer(&scratch_.act, n * f);
  // The training model's own CPU kernels (vectorised), one row at a time so
  // that a row's arithmetic never depends on the rows around it.
  for (int64_t r = 0; r < n; ++r) {
    Tensor in = Tensor::FromExternal(fc1.data() + r * lw.fc1.out, {lw.fc1.out},
                                     DType::kFloat32, Device::CPU(), nullptr);
    Tensor out = Tensor::FromExternal(act.data() + r * f, {f}, DType::kFloat32,
                                      Device::CPU(), nullptr);
    MCC_RETURN_IF_ERROR(swiglu ? ops::SwiGLU(in, &out) : ops::Gelu(in, &out));
  }
  std::vector<float>& mlp = Buffer(&scratch_.mlp, n * h);
  Apply(lw.fc2, pl.fc2, act.data(), n, mlp.data(), false);
  MCC_RETURN_IF_ERROR(SumOverTp(&mlp));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t e = 0; e < h; ++e) {
      (*x)[r * h + e] +=
          mlp[r * h + e] + (lw.fc2.bias.empty() ? 0.0f : lw.fc2.bias[e]);
    }
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::MoeRows(const LayerWeights& lw, const PackedLayer& pl,
                                  const float* ln, int64_t n,
                                  float* out) const {
  const MoeWeights& m = lw.moe;
  const int64_t h = weights_.config.hidden_size;
  const int64_t e = static_cast<int64_t>(m.fc1.size()), k = m.router.topk;
  const bool swiglu = weights_.config.activation == gpt::Activation::kSwiGLU;
  auto host = [](float* data, Shape shape) {
    return Tensor::FromExternal(data, std::move(shape), DType::kFloat32,
                                Device::CPU(), nullptr);
  };
  std::vector<float> logits(e), scores(e), weights(k);
  std::vector<int32_t> indices(k);
  Tensor logits_t = host(logits.data(), {1, e});
  Tensor scores_t = host(scores.data(), {1, e});
  Tensor weights_t = host(weights.data(), {1, k});
  Tensor indices_t = Tensor::FromExternal(indices.data(), {1, k}, DType::kInt32,
                                          Device::CPU(), nullptr);
  std::vector<float> bias = m.expert_bias;
  Tensor bias_t;
  if (!bias.empty()) bias_t = host(bias.data(), {e});
  std::vector<float> fc1, act, y(h);
  // One expert (or the shared one) of row x, added to acc times w.
  auto expert = [&](const RowGemmWeights& w1, int64_t w1_out,
                    const RowGemmWeights& w2, const float* x, float w,
                    float* acc) -> absl::Status {
    const int64_t f = swiglu ? w1_out / 2 : w1_out;
    fc1.resize(w1_out);
    act.resize(f);
    RowGemm(x, 1, w1, fc1.data());
    Tensor in = host(fc1.data(), {w1_out}), a = host(act.data(), {f});
    MCC_RETURN_IF_ERROR(swiglu ? ops::SwiGLU(in, &a) : ops::Gelu(in, &a));
    RowGemm(act.data(), 1, w2, y.data());
    for (int64_t j = 0; j < h; ++j) acc[j] += w * y[j];
    return absl::OkStatus();
  };
  for (int64_t r = 0; r < n; ++r) {
    const float* x = ln + r * h;
    float* acc = out + r * h;
    RowGemm(x, 1, pl.router, logits.data());
    MCC_RETURN_IF_ERROR(
        ops::MoeRouterForward(logits_t, bias.empty() ? nullptr : &bias_t,
                              m.router, &scores_t, &indices_t, &weights_t));
    std::fill(acc, acc + h, 0.0f);
    // The choices in order, as the training model's unpermutation sums.
    for (int64_t j = 0; j < k; ++j) {
      const int32_t ex = indices[j];
      MCC_RETURN_IF_ERROR(expert(pl.expert_fc1[ex], m.fc1[ex].out,
                                 pl.expert_fc2[ex], x, weights[j], acc));
    }
    if (m.shared_fc1.out > 0) {
      float gate = 1.0f;
      if (!m.shared_gate.empty()) {
        // sigmoid(x . w_g), the sum in fp32 as the training model's GEMM.
        float logit = 0.0f;
        for (int64_t j = 0; j < h; ++j) logit += x[j] * m.shared_gate[j];
        gate = 1.0f / (1.0f + std::exp(-logit));
      }
      MCC_RETURN_IF_ERROR(
          expert(pl.shared_fc1, m.shared_fc1.out, pl.shared_fc2, x, gate, acc));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ModelRunner::Logits(
    const StepRows& rows, const std::vector<float>& x) {
  const int64_t h = weights_.config.hidden_size;
  const int64_t l = static_cast<int64_t>(rows.logit_rows.size());
  std::vector<float> picked(l * h);
  for (int64_t j = 0; j < l; ++j) {
    std::memcpy(picked.data() + j * h, x.data() + rows.logit_rows[j] * h,
                h * sizeof(float));
  }
  std::vector<float> normed(l * h);
  Norm(weights_.final_norm, picked.data(), l, normed.data());
  const int64_t vr = weights_.vocab_rows, tp = weights_.tp_size;
  std::vector<float> local(l * vr);
  RowGemm(normed.data(), l, packed_head_, local.data());
  std::vector<float> all;
  if (tp > 1) {
    all.resize(tp * l * vr);
    Tensor in = HostTensor(&local), out = HostTensor(&all);
    MCC_RETURN_IF_ERROR(tp_->AllGatherSync(in, &out));
  } else {
    all = std::move(local);
  }
  const int64_t vocab = weights_.config.vocab_size;
  std::vector<float> logits(l * vocab);
  for (int64_t r = 0; r < tp; ++r) {
    for (int64_t j = 0; j < l; ++j) {
      for (int64_t e = 0; e < vr; ++e) {
        const int64_t col = r * vr + e;
        if (col < vocab) logits[j * vocab + col] = all[(r * l + j) * vr + e];
      }
    }
  }
  return logits;
}

absl::StatusOr<std::vector<float>> ModelRunner::Run(
    const StepRows& rows, std::vector<float>* hidden) {
  if (device_ != nullptr) return device_->Run(rows);
  const int64_t n = rows.rows(), h = weights_.config.hidden_size;
  std::vector<const int32_t*> tables(n);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t t = rows.table[r];
    if (t < 0 || t >= static_cast<int32_t>(rows.tables.size()) ||
        rows.positions[r] < 0 ||
        rows.positions[r] >= weights_.config.max_positions() ||
        cache_.BlocksFor(rows.positions[r] + 1) >
            static_cast<int64_t>(rows.tables[t].size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("step row ", r, " at position ", rows.positions[r],
                       " has no block for it (table ", t, ")"));
    }
    tables[r] = rows.tables[t].data();
  }
  if (weights_.pre_process) {
    MCC_RETURN_IF_ERROR(Embed(rows, hidden));
  } else if (static_cast<int64_t>(hidden->size()) != n * h) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage input holds ", hidden->size(), " values, not ", n,
                     " rows of ", h));
  }
  for (int i = 0; i < static_cast<int>(weights_.layers.size()); ++i) {
    MCC_RETURN_IF_ERROR(Layer(i, rows, tables, hidden));
  }
  if (!weights_.post_process) return std::vector<float>();
  return Logits(rows, *hidden);
}

}  // namespace inference
}  // namespace mcc
