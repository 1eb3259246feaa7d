#include "inference/device_step.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/allocator.h"
#include "core/cuda/runtime.h"
#include "core/graph_capture.h"
#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/bias.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/fp8_weight.h"
#include "core/ops/gemm.h"
#include "core/ops/int8_gemm.h"
#include "core/ops/int8_quantize.h"
#include "core/ops/layout.h"
#include "core/ops/moe_permute.h"
#include "core/ops/moe_router.h"
#include "core/ops/norm.h"
#include "core/ops/paged_attention.h"
#include "core/ops/sliding_window.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "glog/logging.h"

namespace mcc {
namespace inference {
namespace {

int64_t Elements(const LinearWeights& lin) { return lin.out * lin.in; }

int64_t NormBytes(const NormWeights& n) {
  return static_cast<int64_t>(n.weight.size() + n.bias.size()) * 4;
}

// Blocks past the engine's for the padding rows of decode graphs.
int64_t ScratchBlocks(const DeviceStepOptions& options,
                      const KvCacheShape& shape) {
  if (options.graph_batch_sizes.empty()) return 0;
  return (options.graph_batch_sizes.back() + shape.block_size - 1) /
         shape.block_size;
}

// A host fp32 array as a device tensor of `dtype` (undefined when empty).
absl::StatusOr<Tensor> Upload(const std::vector<float>& values, Shape shape,
                              DType dtype, Device device) {
  if (values.empty()) return Tensor();
  MCC_ASSIGN_OR_RETURN(Tensor host, Tensor::FromVector(values, shape, dtype));
  return host.To(device);
}

// Uniform values of standard deviation 0.02 (splitmix64 per element from
// `seed`, so threads need no shared state), as `dtype` on `device`.
absl::StatusOr<Tensor> RandomOn(Shape shape, DType dtype, Device device,
                                uint64_t seed) {
  std::vector<float> v(NumElements(shape));
  const float a = 0.02f * std::sqrt(3.0f);
  ThreadPool::Global().ParallelFor(
      static_cast<int64_t>(v.size()), 1 << 16, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i);
          z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
          z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
          z ^= z >> 31;
          const float u = static_cast<float>(z >> 40) / 16777216.0f;  // [0,1)
          v[i] = (2.0f * u - 1.0f) * a;
        }
      });
  return Upload(v, std::move(shape), dtype, device);
}

Tensor Empty(Shape shape, DType dtype, Device device) {
  return Tensor::Empty(std::move(shape), dtype, device);
}

// Host int8 values [rows, cols] (int8 weights or E4M3 codes) on `device`.
absl::StatusOr<Tensor> UploadBytes(const std::vector<int8_t>& values,
                                   int64_t rows, int64_t cols, Device device) {
  if (static_cast<int64_t>(values.size()) != rows * cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("a quantised weight holds ", values.size(),
                     " values, not [", rows, ", ", cols, "]"));
  }
  Tensor host = Tensor::Empty({rows, cols}, DType::kInt8);
  std::copy(values.begin(), values.end(), host.data<int8_t>());
  return host.To(device);
}

bool Quantised(const LinearWeights& lin) {
  return !lin.q.empty() || !lin.fp8_codes.empty();
}

// The order a step's rows run in: first those that attend through the
// paged kernel (in step order), then those that attend through flash
// attention, packed.
struct RowOrder {
  std::vector<int64_t> order;  // The step row of each row run.
  int64_t paged_rows = 0;
  // The packed rows' first keys, counted from the first packed row.
  std::vector<int64_t> first_key;
};

// A run is a longest stretch of a step's rows of one request at
// consecutive positions. A run whose first row's window starts at the
// run's first position (a prompt chunk from position 0, or a window of one
// key) reads only its own rows' keys, so with `flash` it attends as one
// document of the packed sequence: causal from its first row, each row's
// first key raised to its window's start. Other runs (decode rows, chunks
// after a cached prefix) read the pool.
RowOrder OrderRows(const StepRows& rows, int64_t window_left, bool flash) {
  const int64_t n = rows.rows();
  RowOrder plan;
  std::vector<int64_t> packed;
  for (int64_t r0 = 0, r1 = 0; r0 < n; r0 = r1) {
    for (r1 = r0 + 1; r1 < n && rows.table[r1] == rows.table[r0] &&
                      rows.positions[r1] == rows.positions[r1 - 1] + 1;
         ++r1) {
    }
    const int64_t start = rows.positions[r0];
    // A window's start never falls as the position grows: the run's first
    // row decides.
    if (!flash || ops::SlidingWindowFirstKey(start, window_left) < start) {
      for (int64_t r = r0; r < r1; ++r) plan.order.push_back(r);
      continue;
    }
    const int64_t base = static_cast<int64_t>(packed.size());
    for (int64_t r = r0; r < r1; ++r) {
      packed.push_back(r);
      plan.first_key.push_back(
          base + ops::SlidingWindowFirstKey(rows.positions[r], window_left) -
          start);
    }
  }
  plan.paged_rows = static_cast<int64_t>(plan.order.size());
  plan.order.insert(plan.order.end(), packed.begin(), packed.end());
  return plan;
}

}  // namespace

LinearWeightBytes DeviceLinearWeightBytes(const InferenceWeights& w,
                                          DType dtype) {
  LinearWeightBytes out;
  for (const LayerWeights& lw : w.layers) {
    for (const LinearWeights* lin : {&lw.qkv, &lw.proj, &lw.fc1, &lw.fc2}) {
      const int64_t dense = Elements(*lin) * DTypeSize(dtype);
      out.dense += dense;
      // One byte a weight and an fp32 scale a row.
      out.stored += Quantised(*lin) ? Elements(*lin) + lin->out * 4 : dense;
    }
  }
  return out;
}

const char* LinearWeightsFormat(const InferenceWeights& w) {
  for (const LayerWeights& lw : w.layers) {
    if (!lw.qkv.q.empty()) return "int8";
    if (!lw.qkv.fp8_codes.empty()) return "FP8 (E4M3)";
  }
  return "";
}

int64_t DeviceWeightBytes(const InferenceWeights& w, DType dtype) {
  const int64_t size = DTypeSize(dtype);
  int64_t bytes = DeviceLinearWeightBytes(w, dtype).stored;
  for (const LayerWeights& lw : w.layers) {
    for (const LinearWeights* lin : {&lw.qkv, &lw.proj, &lw.fc1, &lw.fc2}) {
      bytes += static_cast<int64_t>(lin->bias.size()) * 4;
    }
    for (const NormWeights* n : {&lw.ln1, &lw.ln2, &lw.q_norm, &lw.k_norm}) {
      bytes += NormBytes(*n);
    }
    if (lw.is_moe()) {
      const MoeWeights& m = lw.moe;
      bytes +=
          static_cast<int64_t>(m.router_weight.size() + m.expert_bias.size() +
                               m.shared_gate.size()) *
          4;
      std::vector<const LinearWeights*> experts = {&m.shared_fc1,
                                                   &m.shared_fc2};
      for (const LinearWeights& e : m.fc1) experts.push_back(&e);
      for (const LinearWeights& e : m.fc2) experts.push_back(&e);
      for (const LinearWeights* lin : experts) {
        bytes +=
            Elements(*lin) * size + static_cast<int64_t>(lin->bias.size()) * 4;
      }
    }
  }
  bytes +=
      static_cast<int64_t>(w.word_embeddings.size() + w.output.size()) * size;
  bytes += static_cast<int64_t>(w.position_embeddings.size()) * 4;
  bytes += NormBytes(w.final_norm);
  return bytes;
}

absl::StatusOr<int64_t> DeviceMemoryFor(const DeviceStepOptions& options) {
  if (options.memory_bytes > 0) return options.memory_bytes;
  if (options.device.is_cuda()) {
    return cuda::FreeMemoryBytes(options.device.index);
  }
  return -1;
}

static absl::Status CheckFits(int64_t weight_bytes, const KvCacheShape& shape,
                              int64_t kv_blocks,
                              const DeviceStepOptions& options,
                              int64_t memory_bytes, const std::string& what) {
  if (memory_bytes < 0) return absl::OkStatus();
  const int64_t pool_bytes = kv_blocks * shape.BlockBytes();
  if (weight_bytes + pool_bytes <= memory_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s needs %s of %s weights and %s of KV cache (%d blocks) on %s, which "
      "has %s free: %s",
      what, FormatBytes(weight_bytes), DTypeName(options.dtype),
      FormatBytes(pool_bytes), kv_blocks, options.device.ToString(),
      FormatBytes(memory_bytes),
      weight_bytes > memory_bytes
          ? "the weights alone do not fit (use more tensor-parallel ranks, "
            "or --device cpu)"
          : "lower --kv-cache-bytes"));
}

absl::Status CheckFitsDevice(const InferenceWeights& weights,
                             const KvCacheShape& shape, int64_t kv_blocks,
                             const DeviceStepOptions& options,
                             int64_t memory_bytes, const std::string& what) {
  return CheckFits(DeviceWeightBytes(weights, options.dtype), shape, kv_blocks,
                   options, memory_bytes, what);
}

absl::StatusOr<RandomQuantize> RandomQuantizeFromFlag(
    const std::string& value) {
  if (value.empty()) return RandomQuantize::kNone;
  if (value == "int8") return RandomQuantize::kInt8;
  if (value == "fp8") return RandomQuantize::kFp8PerChannel;
  if (value == "fp8-per-tensor") return RandomQuantize::kFp8PerTensor;
  return absl::InvalidArgumentError(absl::StrCat(
      "--quantize must be int8, fp8 or fp8-per-tensor (or empty), got '", value,
      "'"));
}

LinearWeightBytes RandomLinearWeightBytes(const InferenceWeights& shapes,
                                          DType dtype,
                                          RandomQuantize quantize) {
  LinearWeightBytes out;
  for (const LayerWeights& lw : shapes.layers) {
    for (const LinearWeights* lin : {&lw.qkv, &lw.proj, &lw.fc1, &lw.fc2}) {
      const int64_t dense = Elements(*lin) * DTypeSize(dtype);
      out.dense += dense;
      out.stored += quantize == RandomQuantize::kNone
                        ? dense
                        : Elements(*lin) + lin->out * 4;
    }
  }
  return out;
}

static int64_t RandomWeightBytes(const InferenceWeights& shapes, DType dtype,
                                 RandomQuantize quantize) {
  const int64_t h = shapes.config.hidden_size;
  const int64_t tables =
      shapes.config.untie_embeddings_and_output_weights ? 2 : 1;
  const LinearWeightBytes linear =
      RandomLinearWeightBytes(shapes, dtype, quantize);
  return DeviceWeightBytes(shapes, dtype) - linear.dense + linear.stored +
         tables * shapes.vocab_rows * h * DTypeSize(dtype);
}

InferenceWeights WeightShapes(const gpt::GPTConfig& c) {
  InferenceWeights w;
  w.config = c;
  w.local_heads = c.num_attention_heads;
  w.local_groups = c.query_groups();
  w.vocab_rows = c.padded_vocab_size(1);
  const int64_t h = c.hidden_size, d = c.head_dim();
  const bool layer_norm = c.normalization == gpt::Normalization::kLayerNorm;
  auto norm = [&](int64_t n) {
    NormWeights out;
    out.weight.assign(n, 1.0f);
    if (layer_norm) out.bias.assign(n, 0.0f);
    return out;
  };
  auto linear = [&](int64_t out, int64_t in, bool bias) {
    LinearWeights lin;
    lin.out = out;
    lin.in = in;
    if (bias) lin.bias.assign(out, 0.0f);
    return lin;
  };
  const int64_t ffn = c.ffn();
  const bool swiglu = c.activation == gpt::Activation::kSwiGLU;
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers.emplace_back();
    l.ln1 = norm(h);
    l.ln2 = norm(h);
    if (c.qk_layernorm) {
      l.q_norm = norm(d);
      l.k_norm = norm(d);
    }
    l.qkv = linear((w.local_heads + 2 * w.local_groups) * d, h, c.qkv_bias());
    l.proj = linear(h, w.local_heads * d, c.add_bias_linear);
    l.fc1 = linear(swiglu ? 2 * ffn : ffn, h, c.add_bias_linear);
    l.fc2 = linear(h, ffn, c.add_bias_linear);
  }
  w.final_norm = norm(h);
  if (c.position_embedding == gpt::PositionEmbedding::kLearned) {
    w.position_embeddings.resize(c.max_positions() * h);
    for (size_t i = 0; i < w.position_embeddings.size(); ++i) {
      w.position_embeddings[i] = 0.02f * std::sin(static_cast<float>(i));
    }
  }
  return w;
}

absl::StatusOr<std::unique_ptr<DeviceStep>> DeviceStep::Create(
    const InferenceWeights& w, const KvCacheShape& shape, int64_t kv_blocks,
    const DeviceStepOptions& options, const std::string& what) {
  return Make(w, shape, kv_blocks, options, what, nullptr,
              RandomQuantize::kNone);
}

absl::StatusOr<std::unique_ptr<DeviceStep>> DeviceStep::CreateRandom(
    const InferenceWeights& shapes, const KvCacheShape& shape,
    int64_t kv_blocks, const DeviceStepOptions& options, uint64_t seed,
    RandomQuantize quantize) {
  return Make(shapes, shape, kv_blocks, options, "random weights", &seed,
              quantize);
}

absl::StatusOr<std::unique_ptr<DeviceStep>> DeviceStep::Make(
    const InferenceWeights& w, const KvCacheShape& shape, int64_t kv_blocks,
    const DeviceStepOptions& options, const std::string& what,
    const uint64_t* seed, RandomQuantize quantize) {
  if (options.dtype != DType::kBFloat16 && options.dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("the engine on a device keeps its weights in bf16 or "
                     "fp32, not ",
                     DTypeName(options.dtype)));
  }
  if (!w.pre_process || !w.post_process) {
    return absl::UnimplementedError(
        "the engine on a device runs every layer in each process so far "
        "(--pipeline-model-parallel-size 1); use --device cpu for a PP "
        "layout");
  }
  if (w.tp_size > 1) {
    if (options.tp == nullptr || options.tp->size() != w.tp_size ||
        options.tp->device() != options.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights of tensor-parallel rank ", w.tp_rank, " of ", w.tp_size,
          " need a tensor-parallel group of ", w.tp_size, " ranks moving ",
          options.device.ToString(), " tensors"));
    }
    if (!options.graph_batch_sizes.empty()) {
      return absl::UnimplementedError(
          "decode graphs (--cuda-graph) with --tensor-model-parallel-size > 1 "
          "are not built: the collectives run eagerly; drop --cuda-graph");
    }
  }
  for (const LayerWeights& lw : w.layers) {
    if (lw.is_moe() && seed != nullptr) {
      return absl::UnimplementedError(
          "MoE layers (--num-experts) on a device run from a checkpoint so "
          "far (not --random-weights)");
    }
    if (lw.is_moe() && !options.graph_batch_sizes.empty()) {
      // Each MoE layer reads its experts' row counts back to the host.
      return absl::UnimplementedError(
          "decode graphs (--cuda-graph) of MoE layers are not built: drop "
          "--cuda-graph");
    }
    if (seed != nullptr && Quantised(lw.qkv)) {
      return absl::InvalidArgumentError(
          "random weights are made dense on the device");
    }
  }
  MCC_ASSIGN_OR_RETURN(const int64_t memory, DeviceMemoryFor(options));
  const int64_t bytes = seed == nullptr
                            ? DeviceWeightBytes(w, options.dtype)
                            : RandomWeightBytes(w, options.dtype, quantize);
  MCC_RETURN_IF_ERROR(CheckFits(bytes, shape,
                                kv_blocks + ScratchBlocks(options, shape),
                                options, memory, what));
  if (!std::is_sorted(options.graph_batch_sizes.begin(),
                      options.graph_batch_sizes.end()) ||
      (!options.graph_batch_sizes.empty() &&
       options.graph_batch_sizes.front() < 1)) {
    return absl::InvalidArgumentError(
        "the decode graphs' batch sizes must be positive and ascending");
  }
  std::unique_ptr<DeviceStep> step(new DeviceStep());
  step->options_ = options;
  step->config_ = w.config;
  step->local_heads_ = w.local_heads;
  step->local_groups_ = w.local_groups;
  step->vocab_rows_ = w.vocab_rows;
  step->vocab_start_ = w.vocab_start;
  step->tp_size_ = w.tp_size;
  step->shape_ = shape;
  const Device dev = options.device;
  const DType wt = options.dtype;
  const int64_t h = w.config.hidden_size;
  auto norm = [&](const NormWeights& n) -> absl::StatusOr<Norm> {
    Norm out;
    const int64_t len = static_cast<int64_t>(n.weight.size());
    MCC_ASSIGN_OR_RETURN(out.weight,
                         Upload(n.weight, {len}, DType::kFloat32, dev));
    MCC_ASSIGN_OR_RETURN(out.bias, Upload(n.bias, {len}, DType::kFloat32, dev));
    return out;
  };
  uint64_t next_seed = seed == nullptr ? 0 : *seed;
  // A [rows, cols] matrix of the weights': its values, or random ones.
  auto matrix = [&](const std::vector<float>& values, int64_t rows,
                    int64_t cols) -> absl::StatusOr<Tensor> {
    if (seed == nullptr) return Upload(values, {rows, cols}, wt, dev);
    next_seed += 0x632be59bd9b4e019ull;
    return RandomOn({rows, cols}, wt, dev, next_seed);
  };
  auto linear = [&](const LinearWeights& lin) -> absl::StatusOr<Linear> {
    Linear out;
    if (!lin.q.empty()) {
      out.format = Linear::kInt8;
      MCC_ASSIGN_OR_RETURN(out.weight,
                           UploadBytes(lin.q, lin.out, lin.in, dev));
      MCC_ASSIGN_OR_RETURN(out.scales,
                           Upload(lin.scales, {lin.out}, DType::kFloat32, dev));
    } else if (!lin.fp8_codes.empty()) {
      out.format = Linear::kFp8;
      MCC_ASSIGN_OR_RETURN(out.weight,
                           UploadBytes(lin.fp8_codes, lin.out, lin.in, dev));
      MCC_ASSIGN_OR_RETURN(
          out.scales, Upload(lin.fp8_scales, {lin.out}, DType::kFloat32, dev));
    } else if (seed != nullptr && quantize != RandomQuantize::kNone) {
      // Drawn dense, quantised on the device, the dense copy dropped.
      MCC_ASSIGN_OR_RETURN(const Tensor dense,
                           matrix(lin.weight, lin.out, lin.in));
      Tensor absmax = Empty({lin.out}, DType::kFloat32, dev);
      out.weight = Empty({lin.out, lin.in}, DType::kInt8, dev);
      out.scales = Empty({lin.out}, DType::kFloat32, dev);
      if (quantize == RandomQuantize::kInt8) {
        out.format = Linear::kInt8;
        MCC_RETURN_IF_ERROR(ops::RowAbsMax(dense, &absmax));
        MCC_RETURN_IF_ERROR(
            ops::QuantizeRowsInt8(dense, absmax, &out.weight, &out.scales));
      } else {
        out.format = Linear::kFp8;
        MCC_RETURN_IF_ERROR(
            ops::Fp8WeightAbsMax(dense,
                                 quantize == RandomQuantize::kFp8PerChannel
                                     ? ops::Fp8WeightScaling::kPerChannel
                                     : ops::Fp8WeightScaling::kPerTensor,
                                 &absmax));
        MCC_RETURN_IF_ERROR(
            ops::QuantizeWeightFp8(dense, absmax, &out.weight, &out.scales));
      }
    } else {
      MCC_ASSIGN_OR_RETURN(out.weight, matrix(lin.weight, lin.out, lin.in));
    }
    if (out.format != Linear::kDense && out.scales.numel() != lin.out) {
      return absl::InvalidArgumentError(
          absl::StrCat("a quantised weight [", lin.out, ", ", lin.in, "] has ",
                       out.scales.numel(), " scales"));
    }
    MCC_ASSIGN_OR_RETURN(out.bias,
                         Upload(lin.bias, {lin.out}, DType::kFloat32, dev));
    return out;
  };
  for (const LayerWeights& lw : w.layers) {
    Layer& l = step->layers_.emplace_back();
    MCC_ASSIGN_OR_RETURN(l.ln1, norm(lw.ln1));
    MCC_ASSIGN_OR_RETURN(l.ln2, norm(lw.ln2));
    MCC_ASSIGN_OR_RETURN(l.q_norm, norm(lw.q_norm));
    MCC_ASSIGN_OR_RETURN(l.k_norm, norm(lw.k_norm));
    MCC_ASSIGN_OR_RETURN(l.qkv, linear(lw.qkv));
    MCC_ASSIGN_OR_RETURN(l.proj, linear(lw.proj));
    MCC_ASSIGN_OR_RETURN(l.fc1, linear(lw.fc1));
    MCC_ASSIGN_OR_RETURN(l.fc2, linear(lw.fc2));
    if (lw.is_moe()) {
      const MoeWeights& m = lw.moe;
      const int64_t e = static_cast<int64_t>(m.fc1.size());
      l.moe.router = m.router;
      // Router and gate in fp32, as the training model's router GEMM.
      MCC_ASSIGN_OR_RETURN(
          l.moe.router_gate.weight,
          Upload(m.router_weight, {e, h}, DType::kFloat32, dev));
      MCC_ASSIGN_OR_RETURN(l.moe.expert_bias,
                           Upload(m.expert_bias, {e}, DType::kFloat32, dev));
      for (int64_t x = 0; x < e; ++x) {
        MCC_ASSIGN_OR_RETURN(l.moe.fc1.emplace_back(), linear(m.fc1[x]));
        MCC_ASSIGN_OR_RETURN(l.moe.fc2.emplace_back(), linear(m.fc2[x]));
      }
      if (m.shared_fc1.out > 0) {
        MCC_ASSIGN_OR_RETURN(l.moe.shared_fc1, linear(m.shared_fc1));
        MCC_ASSIGN_OR_RETURN(l.moe.shared_fc2, linear(m.shared_fc2));
      }
      MCC_ASSIGN_OR_RETURN(l.moe.shared_gate.weight,
                           Upload(m.shared_gate, {1, h}, DType::kFloat32, dev));
    }
  }
  MCC_ASSIGN_OR_RETURN(step->word_embeddings_,
                       matrix(w.word_embeddings, w.vocab_rows, h));
  MCC_ASSIGN_OR_RETURN(
      step->position_embeddings_,
      Upload(w.position_embeddings,
             {static_cast<int64_t>(w.position_embeddings.size()) / h, h},
             DType::kFloat32, dev));
  const bool untied = seed == nullptr
                          ? !w.output.empty()
                          : w.config.untie_embeddings_and_output_weights;
  if (!untied) {
    step->head_ = step->word_embeddings_;
  } else {
    MCC_ASSIGN_OR_RETURN(step->head_, matrix(w.output, w.vocab_rows, h));
  }
  MCC_ASSIGN_OR_RETURN(step->final_norm_, norm(w.final_norm));
  step->kv_blocks_ = kv_blocks;
  step->graph_table_width_ =
      (w.config.max_positions() + shape.block_size - 1) / shape.block_size;
  for (int64_t i = 0; i < shape.num_layers; ++i) {
    const Shape pool = {kv_blocks + ScratchBlocks(options, shape),
                        shape.block_size, shape.kv_heads, shape.head_dim};
    step->k_pool_.push_back(Tensor::Zeros(pool, DType::kFloat32, dev));
    step->v_pool_.push_back(Tensor::Zeros(pool, DType::kFloat32, dev));
  }
  step->weight_bytes_ = bytes;
  step->pool_bytes_ =
      (kv_blocks + ScratchBlocks(options, shape)) * shape.BlockBytes();
  return step;
}

absl::Status DeviceStep::Gemm(const Tensor& x, const Linear& lin,
                              Tensor* y) const {
  // GEMM inputs in the weights' dtype (quantised weights take x as it
  // is: their kernels widen it and decode the weights in their loads);
  // outputs fp32.
  Tensor in = x;
  if (lin.format == Linear::kDense && x.dtype() != lin.weight.dtype()) {
    in = Empty(x.shape(), lin.weight.dtype(), x.device());
    MCC_RETURN_IF_ERROR(ops::Convert(x, &in));
  }
  auto gemm = [&lin](const Tensor& a, Tensor* out) {
    switch (lin.format) {
      case Linear::kInt8:
        return ops::Int8Gemm(a, lin.weight, lin.scales, out);
      case Linear::kFp8:
        return ops::Fp8WeightGemm(a, lin.weight, lin.scales, out);
      default:
        return ops::Gemm(a, false, lin.weight, true, out);
    }
  };
  if (!options_.batch_invariant || in.size(0) <= 1) {
    MCC_RETURN_IF_ERROR(gemm(in, y));
  } else {
    // One row at a time: every row through the same kernel, whatever the
    // batch (the library picks kernels by the row count).
    for (int64_t r = 0; r < in.size(0); ++r) {
      MCC_ASSIGN_OR_RETURN(Tensor yr, y->Slice(r, r + 1));
      MCC_ASSIGN_OR_RETURN(Tensor xr, in.Slice(r, r + 1));
      MCC_RETURN_IF_ERROR(gemm(xr, &yr));
    }
  }
  if (lin.bias.defined()) MCC_RETURN_IF_ERROR(ops::BiasAdd(*y, lin.bias, y));
  return absl::OkStatus();
}

absl::Status DeviceStep::SumOverTp(Tensor* x) const {
  if (tp_size_ <= 1) return absl::OkStatus();
  // Ranks' parts one after another along dim 0.
  const int64_t n = x->size(0);
  Shape all_shape = x->shape();
  all_shape[0] = tp_size_ * n;
  Tensor all = Empty(all_shape, x->dtype(), x->device());
  MCC_RETURN_IF_ERROR(options_.tp->AllGatherSync(*x, &all));
  // Rank 0's part, then each next rank's added: the CPU engine's order.
  for (int r = 0; r < tp_size_; ++r) {
    MCC_ASSIGN_OR_RETURN(Tensor part, all.Slice(r * n, (r + 1) * n));
    MCC_RETURN_IF_ERROR(r == 0 ? x->CopyFrom(part) : ops::Add(*x, part, x));
  }
  return absl::OkStatus();
}

absl::Status DeviceStep::RowParallelGemm(const Tensor& x, const Linear& lin,
                                         Tensor* y) const {
  if (tp_size_ <= 1) return Gemm(x, lin, y);
  Linear no_bias = lin;
  no_bias.bias = Tensor();
  MCC_RETURN_IF_ERROR(Gemm(x, no_bias, y));
  MCC_RETURN_IF_ERROR(SumOverTp(y));
  if (lin.bias.defined()) MCC_RETURN_IF_ERROR(ops::BiasAdd(*y, lin.bias, y));
  return absl::OkStatus();
}

absl::Status DeviceStep::ApplyNorm(const Norm& norm, const Tensor& x,
                                   Tensor* y) const {
  const float eps = static_cast<float>(config_.norm_epsilon);
  const int64_t rows = x.numel() / x.size(-1);
  Tensor rstd = Empty({rows}, DType::kFloat32, x.device());
  if (norm.bias.defined()) {
    Tensor mean = Empty({rows}, DType::kFloat32, x.device());
    return ops::LayerNormForward(x, norm.weight, norm.bias, eps, y, &mean,
                                 &rstd);
  }
  return ops::RMSNormForward(x, norm.weight, eps, y, &rstd);
}

absl::Status DeviceStep::Attend(int i, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& positions,
                                const Tensor& tables, const AttentionPlan& plan,
                                Tensor* ctx) const {
  const int64_t n = q.size(0), np = plan.paged_rows;
  if (np > 0) {
    MCC_ASSIGN_OR_RETURN(const Tensor pq, q.Slice(0, np));
    MCC_ASSIGN_OR_RETURN(const Tensor pt, tables.Slice(0, np));
    MCC_ASSIGN_OR_RETURN(const Tensor pp, positions.Slice(0, np));
    MCC_ASSIGN_OR_RETURN(Tensor out, ctx->Slice(0, np));
    MCC_RETURN_IF_ERROR(ops::PagedAttention(pq, k_pool_[i], v_pool_[i], pt, pp,
                                            &out, config_.window_left));
  }
  if (np == n) return absl::OkStatus();
  // The packed prompts: [1, m, heads, d], the inputs in the weights' dtype
  // (bf16 takes the tensor cores on a GPU), the output fp32 into ctx.
  const Device dev = options_.device;
  const int64_t m = n - np, heads = q.size(1), groups = k.size(1);
  const int64_t d = q.size(2);
  auto packed = [&](const Tensor& t, int64_t h) -> absl::StatusOr<Tensor> {
    MCC_ASSIGN_OR_RETURN(Tensor rows, t.Slice(np, n));
    MCC_ASSIGN_OR_RETURN(rows, rows.Reshape({1, m, h, d}));
    if (options_.dtype == DType::kFloat32) return rows;
    Tensor low = Empty(rows.shape(), options_.dtype, dev);
    MCC_RETURN_IF_ERROR(ops::Convert(rows, &low));
    return low;
  };
  MCC_ASSIGN_OR_RETURN(const Tensor fq, packed(q, heads));
  MCC_ASSIGN_OR_RETURN(const Tensor fk, packed(k, groups));
  MCC_ASSIGN_OR_RETURN(const Tensor fv, packed(v, groups));
  MCC_ASSIGN_OR_RETURN(Tensor out, ctx->Slice(np, n));
  MCC_ASSIGN_OR_RETURN(out, out.Reshape({1, m, heads, d}));
  Tensor lse = Empty({1, heads, m}, DType::kFloat32, dev);
  ops::AttentionOptions attention;
  attention.causal = true;
  attention.first_key = plan.first_key;
  return ops::FlashAttentionForward(fq, fk, fv, attention, &out, &lse);
}

absl::Status DeviceStep::RunLayer(int i, const Tensor& positions,
                                  const Tensor& slots, const Tensor& tables,
                                  const AttentionPlan& plan, Tensor* x) {
  const Layer& l = layers_[i];
  const Device dev = options_.device;
  const int64_t n = x->size(0), h = config_.hidden_size, d = config_.head_dim();
  const int64_t groups = local_groups_, heads = local_heads_;
  const int64_t hpg = heads / groups;
  const DType wt = options_.dtype;
  Tensor ln = Empty({n, h}, wt, dev);
  MCC_RETURN_IF_ERROR(ApplyNorm(l.ln1, *x, &ln));
  Tensor qkv = Empty({n, l.qkv.weight.size(0)}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(Gemm(ln, l.qkv, &qkv));
  // [n, groups, hpg + 2, d] into q, k, v (Megatron's grouped layout).
  MCC_ASSIGN_OR_RETURN(Tensor grouped, qkv.Reshape({n, groups, hpg + 2, d}));
  Tensor q = Empty({n, groups, hpg, d}, DType::kFloat32, dev);
  Tensor k = Empty({n, groups, 1, d}, DType::kFloat32, dev);
  Tensor v = Empty({n, groups, 1, d}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(ops::Split(grouped, 2, {&q, &k, &v}));
  MCC_ASSIGN_OR_RETURN(q, q.Reshape({n, heads, d}));
  MCC_ASSIGN_OR_RETURN(k, k.Reshape({n, groups, d}));
  MCC_ASSIGN_OR_RETURN(v, v.Reshape({n, groups, d}));
  if (l.q_norm.weight.defined()) {  // QK-norm: per head, before rotary.
    Tensor qn = Empty(q.shape(), DType::kFloat32, dev);
    Tensor kn = Empty(k.shape(), DType::kFloat32, dev);
    MCC_RETURN_IF_ERROR(ApplyNorm(l.q_norm, q, &qn));
    MCC_RETURN_IF_ERROR(ApplyNorm(l.k_norm, k, &kn));
    q = qn;
    k = kn;
  }
  if (config_.position_embedding == gpt::PositionEmbedding::kRope) {
    const ops::RotaryOptions rotary = config_.Rotary();
    MCC_RETURN_IF_ERROR(ops::RotaryAtPositions(q, positions, rotary, &q));
    MCC_RETURN_IF_ERROR(ops::RotaryAtPositions(k, positions, rotary, &k));
  }
  MCC_RETURN_IF_ERROR(ops::PagedKvWrite(k, v, slots, &k_pool_[i], &v_pool_[i]));
  Tensor ctx = Empty({n, heads, d}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(Attend(i, q, k, v, positions, tables, plan, &ctx));
  MCC_ASSIGN_OR_RETURN(ctx, ctx.Reshape({n, heads * d}));
  Tensor attn = Empty({n, h}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(RowParallelGemm(ctx, l.proj, &attn));
  MCC_RETURN_IF_ERROR(ops::Add(*x, attn, x));
  MCC_RETURN_IF_ERROR(ApplyNorm(l.ln2, *x, &ln));
  Tensor mlp = Empty({n, h}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(!l.moe.fc1.empty() ? MoeMlp(l.moe, ln, &mlp)
                                         : Mlp(l.fc1, l.fc2, ln, &mlp,
                                               /*row_parallel=*/true));
  return ops::Add(*x, mlp, x);
}

absl::Status DeviceStep::Mlp(const Linear& fc1, const Linear& fc2,
                             const Tensor& x, Tensor* y,
                             bool row_parallel) const {
  const Device dev = options_.device;
  const int64_t n = x.size(0), f1 = fc1.weight.size(0);
  Tensor h1 = Empty({n, f1}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(Gemm(x, fc1, &h1));
  const bool swiglu = config_.activation == gpt::Activation::kSwiGLU;
  Tensor act = Empty({n, swiglu ? f1 / 2 : f1}, options_.dtype, dev);
  MCC_RETURN_IF_ERROR(swiglu ? ops::SwiGLU(h1, &act) : ops::Gelu(h1, &act));
  return row_parallel ? RowParallelGemm(act, fc2, y) : Gemm(act, fc2, y);
}

absl::Status DeviceStep::MoeMlp(const Moe& moe, const Tensor& ln,
                                Tensor* y) const {
  // The CPU engine's MoE (model_runner.cc) with the training model's ops
  // (every TP rank holds the whole layer, as the CPU engine's do, and
  // computes it for all rows: no sum over TP):
  // route in fp32, copy each token to its k experts grouped by expert, run
  // each expert over its rows, and sum the k outputs per token in choice
  // order with their weights; the shared expert (gated) is added last.
  const Device dev = options_.device;
  const int64_t n = ln.size(0), h = config_.hidden_size;
  const int64_t e = static_cast<int64_t>(moe.fc1.size()), k = moe.router.topk;
  Tensor ln32 = ln;
  if (ln.dtype() != DType::kFloat32) {
    ln32 = Empty(ln.shape(), DType::kFloat32, dev);
    MCC_RETURN_IF_ERROR(ops::Convert(ln, &ln32));
  }
  Tensor logits = Empty({n, e}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(Gemm(ln32, moe.router_gate, &logits));
  Tensor scores = Empty({n, e}, DType::kFloat32, dev);
  Tensor indices = Empty({n, k}, DType::kInt32, dev);
  Tensor weights = Empty({n, k}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(ops::MoeRouterForward(
      logits, moe.expert_bias.defined() ? &moe.expert_bias : nullptr,
      moe.router, &scores, &indices, &weights));
  Tensor row_to_slot = Empty({n * k}, DType::kInt32, dev);
  Tensor slot_to_row = Empty({n * k}, DType::kInt32, dev);
  Tensor counts = Empty({e}, DType::kInt64, dev);
  MCC_RETURN_IF_ERROR(
      ops::MoeSortTokens(indices, e, &row_to_slot, &slot_to_row, &counts));
  Tensor permuted = Empty({n * k, h}, ln.dtype(), dev);
  MCC_RETURN_IF_ERROR(ops::MoePermute(ln, row_to_slot, &permuted));
  // The experts' row counts on the host (one small copy a layer): each
  // expert's GEMMs take its rows.
  MCC_ASSIGN_OR_RETURN(Tensor host_counts, counts.To(Device::CPU()));
  Tensor expert_out = Empty({n * k, h}, DType::kFloat32, dev);
  int64_t first = 0;
  for (int64_t x = 0; x < e; ++x) {
    const int64_t rows = host_counts.data<int64_t>()[x];
    if (rows == 0) continue;
    MCC_ASSIGN_OR_RETURN(Tensor in, permuted.Slice(first, first + rows));
    MCC_ASSIGN_OR_RETURN(Tensor out, expert_out.Slice(first, first + rows));
    MCC_RETURN_IF_ERROR(Mlp(moe.fc1[x], moe.fc2[x], in, &out,
                            /*row_parallel=*/false));
    first += rows;
  }
  MCC_RETURN_IF_ERROR(ops::MoeUnpermute(expert_out, slot_to_row, &weights, y));
  if (!moe.shared_fc1.weight.defined()) return absl::OkStatus();
  Tensor shared = Empty({n, h}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(Mlp(moe.shared_fc1, moe.shared_fc2, ln, &shared,
                          /*row_parallel=*/false));
  if (moe.shared_gate.weight.defined()) {
    // gate = sigmoid(x . w_g), the training model's way: a one-expert
    // router's weight, applied by an unpermute over its (identity) slots.
    Tensor gate_logit = Empty({n, 1}, DType::kFloat32, dev);
    MCC_RETURN_IF_ERROR(Gemm(ln32, moe.shared_gate, &gate_logit));
    Tensor gate_score = Empty({n, 1}, DType::kFloat32, dev);
    Tensor gate_index = Empty({n, 1}, DType::kInt32, dev);
    Tensor gate = Empty({n, 1}, DType::kFloat32, dev);
    MCC_RETURN_IF_ERROR(ops::MoeRouterForward(gate_logit, nullptr,
                                              ops::SigmoidGateOptions(),
                                              &gate_score, &gate_index, &gate));
    Tensor rows = Empty({n}, DType::kInt32, dev);
    Tensor slots = Empty({n}, DType::kInt32, dev);
    Tensor count = Empty({1}, DType::kInt64, dev);
    MCC_RETURN_IF_ERROR(
        ops::MoeSortTokens(gate_index, 1, &rows, &slots, &count));
    Tensor gated = Empty({n, h}, DType::kFloat32, dev);
    MCC_RETURN_IF_ERROR(ops::MoeUnpermute(shared, slots, &gate, &gated));
    shared = gated;
  }
  return ops::Add(*y, shared, y);
}

int64_t DeviceStep::GraphBatchFor(const StepRows& rows) const {
  const int64_t n = rows.rows();
  if (options_.graph_batch_sizes.empty() ||
      static_cast<int64_t>(rows.logit_rows.size()) != n) {
    return 0;
  }
  // Decode-shaped: every row's logits wanted, in row order.
  for (int64_t j = 0; j < n; ++j) {
    if (rows.logit_rows[j] != j) return 0;
  }
  for (int64_t b : options_.graph_batch_sizes) {
    if (b >= n) return graph_failed_.count(b) > 0 ? 0 : b;
  }
  return 0;
}

absl::StatusOr<Tensor> DeviceStep::Forward(const Tensor& ints,
                                           const Tensor& tables, int64_t n,
                                           int64_t l,
                                           const AttentionPlan& plan) {
  const Device dev = options_.device;
  const int64_t h = config_.hidden_size;
  MCC_ASSIGN_OR_RETURN(Tensor tokens, ints.Slice(0, n));
  MCC_ASSIGN_OR_RETURN(Tensor positions, ints.Slice(n, 2 * n));
  MCC_ASSIGN_OR_RETURN(Tensor slots, ints.Slice(2 * n, 3 * n));
  MCC_ASSIGN_OR_RETURN(Tensor picked_rows, ints.Slice(3 * n, 3 * n + l));
  Tensor x = Empty({n, h}, DType::kFloat32, dev);
  if (tp_size_ > 1) {
    // Vocab-parallel: rows of other ranks' shards are zero here, and the
    // sum over TP takes each row from the one rank holding it (exact).
    ops::EmbeddingShard shard;
    shard.vocab_start = vocab_start_;
    shard.mask_outside = true;
    MCC_RETURN_IF_ERROR(
        ops::EmbeddingLookup(tokens, word_embeddings_, &x, shard));
    MCC_RETURN_IF_ERROR(SumOverTp(&x));
  } else {
    MCC_RETURN_IF_ERROR(ops::EmbeddingLookup(tokens, word_embeddings_, &x));
  }
  if (position_embeddings_.defined()) {
    Tensor pe = Empty({n, h}, DType::kFloat32, dev);
    MCC_RETURN_IF_ERROR(
        ops::EmbeddingLookup(positions, position_embeddings_, &pe));
    MCC_RETURN_IF_ERROR(ops::Add(x, pe, &x));
  }
  for (int i = 0; i < static_cast<int>(layers_.size()); ++i) {
    MCC_RETURN_IF_ERROR(RunLayer(i, positions, slots, tables, plan, &x));
  }
  // The logit rows (x read as a table of n rows), normed, through the head.
  Tensor picked = Empty({l, h}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(ops::EmbeddingLookup(picked_rows, x, &picked));
  Tensor normed = Empty({l, h}, options_.dtype, dev);
  MCC_RETURN_IF_ERROR(ApplyNorm(final_norm_, picked, &normed));
  Tensor logits = Empty({l, vocab_rows_}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(
      Gemm(normed, Linear{Linear::kDense, head_, Tensor(), Tensor()}, &logits));
  if (tp_size_ <= 1) return logits;
  // Each rank's vocabulary shard, [tp x l, vocab_rows], put in order on
  // the host.
  Tensor all = Empty({tp_size_ * l, vocab_rows_}, DType::kFloat32, dev);
  MCC_RETURN_IF_ERROR(options_.tp->AllGatherSync(logits, &all));
  return all;
}

absl::StatusOr<Tensor> DeviceStep::RunGraph(int64_t b, const Tensor& ints,
                                            const Tensor& tables) {
  Graph& g = graphs_[b];
  if (!g.ints.defined()) {
    g.ints = Empty(ints.shape(), DType::kInt64, options_.device);
    g.tables = Empty(tables.shape(), DType::kInt32, options_.device);
  }
  MCC_RETURN_IF_ERROR(g.ints.CopyFrom(ints));
  MCC_RETURN_IF_ERROR(g.tables.CopyFrom(tables));
  AttentionPlan all_paged;  // Decode steps: every row through the pool.
  all_paged.paged_rows = b;
  if (g.graph.valid()) {
    MCC_RETURN_IF_ERROR(g.graph.Replay());
    ++graph_replays_;
    return g.logits;
  }
  // First time at this size: eagerly (the answer, and the warm-up: handles
  // and workspaces made outside the capture), then captured for the next.
  MCC_ASSIGN_OR_RETURN(Tensor logits,
                       Forward(g.ints, g.tables, b, b, all_paged));
  GraphCaptureOptions capture;
  capture.index_inputs_checked_outside = true;  // Checked on the host.
  absl::Status s = BeginGraphCapture(options_.device, capture);
  if (s.ok()) {
    absl::StatusOr<Tensor> captured =
        Forward(g.ints, g.tables, b, b, all_paged);
    absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
    if (captured.ok() && graph.ok()) {
      g.logits = *captured;
      g.graph = std::move(*graph);
      return logits;
    }
    s = !captured.ok() ? captured.status() : graph.status();
  }
  LOG(WARNING) << "decode steps of " << b
               << " rows run eagerly: their graph capture failed: "
               << s.message();
  graph_failed_.insert(b);
  graphs_.erase(b);
  return logits;
}

absl::StatusOr<std::vector<float>> DeviceStep::Run(const StepRows& rows) {
  const int64_t n = rows.rows();
  const int64_t l = static_cast<int64_t>(rows.logit_rows.size());
  const int64_t bs = shape_.block_size;
  if (n == 0) return std::vector<float>();
  // The step's integers, checked here (device kernels do not check data):
  // tokens, positions, slots and logit rows in one int64 upload, the block
  // tables in one int32 upload.
  int64_t max_blocks = 1;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t t = rows.table[r];
    const int64_t p = rows.positions[r];
    if (t < 0 || t >= static_cast<int32_t>(rows.tables.size()) || p < 0 ||
        p >= config_.max_positions() ||
        p / bs >= static_cast<int64_t>(rows.tables[t].size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("step row ", r, " at position ", p,
                       " has no block for it (table ", t, ")"));
    }
    if (rows.tokens[r] < 0 || rows.tokens[r] >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", rows.tokens[r], " of row ", r,
                       " is outside the vocabulary of ", config_.vocab_size));
    }
    max_blocks = std::max(max_blocks, p / bs + 1);
  }
  for (int64_t j = 0; j < l; ++j) {
    if (rows.logit_rows[j] < 0 || rows.logit_rows[j] >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit row ", rows.logit_rows[j], " is not a row of the step"));
    }
  }
  // A decode step of a captured size (padded up to it) replays its graph;
  // the tables then have the graphs' fixed width.
  const int64_t b = GraphBatchFor(rows);
  const int64_t rows_run = b > 0 ? b : n, logits_run = b > 0 ? b : l;
  const int64_t width = b > 0 ? graph_table_width_ : max_blocks;
  // Prompt rows that see only each other go last, for flash attention.
  const RowOrder order =
      OrderRows(rows, config_.window_left,
                b == 0 && options_.flash_prefill && !options_.batch_invariant);
  std::vector<int64_t> run_index(n);
  for (int64_t r = 0; r < n; ++r) run_index[order.order[r]] = r;
  std::vector<int64_t> ints(3 * rows_run + logits_run);
  std::vector<int64_t> tables(rows_run * width, 0);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t src = order.order[r];  // The step's row r runs as.
    const BlockTable& t = rows.tables[rows.table[src]];
    const int64_t p = rows.positions[src];
    // Blocks wholly before a sliding window may have been freed: not read.
    const int64_t first_block =
        ops::SlidingWindowFirstKey(p, config_.window_left) / bs;
    for (int64_t k = first_block; k <= p / bs; ++k) {
      if (t[k] < 0 || t[k] >= kv_blocks_) {
        return absl::InvalidArgumentError(
            absl::StrCat("block ", t[k], " of step row ", src,
                         " is outside the pool of ", kv_blocks_));
      }
      tables[r * width + k] = t[k];
    }
    ints[r] = rows.tokens[src];
    ints[rows_run + r] = p;
    ints[2 * rows_run + r] = int64_t{t[p / bs]} * bs + p % bs;
  }
  // Padding rows: token 0, each in a slot of its own in the scratch blocks
  // past the engine's (position i % block_size of scratch block i /
  // block_size), so they write and read only there.
  for (int64_t r = n; r < rows_run; ++r) {
    const int64_t i = r - n, block = kv_blocks_ + i / bs, p = i % bs;
    tables[r * width] = block;
    ints[rows_run + r] = p;
    ints[2 * rows_run + r] = block * bs + p;
  }
  for (int64_t j = 0; j < logits_run; ++j) {
    ints[3 * rows_run + j] = j < l ? run_index[rows.logit_rows[j]] : j;
  }
  const Device dev = options_.device;
  MCC_ASSIGN_OR_RETURN(
      Tensor host_ints,
      Tensor::FromInts(ints, {3 * rows_run + logits_run}, DType::kInt64));
  MCC_ASSIGN_OR_RETURN(
      Tensor host_tables,
      Tensor::FromInts(tables, {rows_run, width}, DType::kInt32));
  Tensor logits;
  if (b > 0) {
    MCC_ASSIGN_OR_RETURN(logits, RunGraph(b, host_ints, host_tables));
  } else {
    MCC_ASSIGN_OR_RETURN(Tensor dev_ints, host_ints.To(dev));
    MCC_ASSIGN_OR_RETURN(Tensor dev_tables, host_tables.To(dev));
    AttentionPlan attention;
    attention.paged_rows = order.paged_rows;
    if (order.paged_rows < n) {
      // Uploaded once for the step: every layer's flash call reads it on
      // the device (a host one would be copied by each).
      MCC_ASSIGN_OR_RETURN(
          const Tensor host_first_key,
          Tensor::FromInts(order.first_key, {1, n - order.paged_rows},
                           DType::kInt32));
      MCC_ASSIGN_OR_RETURN(attention.first_key, host_first_key.To(dev));
    }
    MCC_ASSIGN_OR_RETURN(logits,
                         Forward(dev_ints, dev_tables, n, l, attention));
    flash_prefill_rows_ += n - order.paged_rows;
  }
  if (l == 0) return std::vector<float>();
  MCC_ASSIGN_OR_RETURN(Tensor host, logits.To(Device::CPU()));
  const int64_t vocab = config_.vocab_size;
  std::vector<float> out(l * vocab);
  const float* p = host.data<float>();
  // [tp, logit rows run, vocab_rows]: rank r's shard holds columns
  // [r * vocab_rows, (r + 1) * vocab_rows) of the padded vocabulary.
  for (int64_t r = 0; r < tp_size_; ++r) {
    const int64_t first = r * vocab_rows_;
    if (first >= vocab) break;
    const int64_t cols = std::min(vocab_rows_, vocab - first);
    for (int64_t j = 0; j < l; ++j) {
      const float* src = p + (r * logits_run + j) * vocab_rows_;
      std::copy(src, src + cols, out.begin() + j * vocab + first);
    }
  }
  return out;
}

}  // namespace inference
}  // namespace mcc
