#ifndef INFERENCE_DEVICE_STEP_H_
#define INFERENCE_DEVICE_STEP_H_

// The engine's model step on a device (a GPU, or the test device in CI):
// the ModelRunner's forward pass of token rows at their own positions, with
// the weights in device memory (bf16, or the checkpoint's fp32), the paged
// KV pool in device memory (fp32) and every computation a dispatch-table op
// (core/ops): GEMMs through ops::Gemm (cuBLAS/cuBLASLt on CUDA), decode
// attention through ops::PagedAttention reading the block tables on the
// device, and prefill attention (prompt chunks with no cached prefix)
// through ops::FlashAttentionForward, the tensor-core slot on a GPU (see
// DeviceStepOptions::flash_prefill). One host-to-device copy of the step's
// token ids, positions, slots and tables, one device-to-host copy of the
// logits (and, with flash prefill, the packed rows' first keys, which the
// flash slot takes on the host).
//
// Numbers: the CPU engine's fp32 path (row_gemm.h's fixed order) is not
// reproduced bit for bit; in fp32 the logits agree to rounding (greedy
// tokens equal the CPU engine's on the test models), in bf16 to bf16's
// rounding of weights and GEMM inputs. Batch invariance: paged attention,
// norms, rotary and activations compute each row alone; a GEMM library may
// choose its kernel (and so its summation order) by the row count, and
// flash prefill packs the step's prompts into one sequence, so by default
// a row's logits may change in the last bits with the rows around it. With
// batch_invariant every GEMM runs one row at a time (the same kernel for
// every row whatever the batch) and every row attends through the paged
// kernel: a request's tokens are then bit-identical batched or alone, at
// the cost of reading the weights once per row.

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/graph_capture.h"
#include "core/ops/moe_router.h"
#include "core/tensor.h"
#include "inference/inference_weights.h"
#include "inference/model_runner.h"
#include "inference/paged_kv_cache.h"

namespace mcc {
namespace inference {

struct DeviceStepOptions {
  Device device = Device::CPU();
  // The linear layers' and embeddings' dtype on the device: kBFloat16 or
  // kFloat32 (norms, biases and the KV pool stay fp32).
  DType dtype = DType::kBFloat16;
  bool batch_invariant = false;
  // Rows of a request whose attention spans only its own rows of the step
  // (a prompt chunk from position 0: no cached prefix) go through
  // ops::FlashAttentionForward, packed as one sequence in which each
  // request is causal within itself (AttentionOptions::first_key, the
  // model's sliding window included); the other rows (decode, chunks after
  // a cached prefix) keep ops::PagedAttention. Keys and values go to the
  // pool either way. The flash inputs are in `dtype` (bf16: the tensor
  // cores'), so in bf16 a prompt's logits differ from the paged kernel's
  // (fp32) by bf16's rounding of q, k and v. Not under batch_invariant (a
  // packed kernel's summation order depends on the packing, so a row's
  // bits would depend on the other requests) nor in decode graphs.
  bool flash_prefill = true;
  // The device memory the step may use; 0: the device's free memory (CUDA)
  // or no bound (other devices). For tests of the refusal.
  int64_t memory_bytes = 0;
  // Decode steps (every row's logits, in row order) of at most the largest
  // of these rows run as device graphs (CUDA graphs), padded up to the next
  // size: captured the first time a size is run (that step eagerly), then
  // replayed. Ascending; empty: every step eagerly. A failed capture leaves
  // that size eager. Padding rows compute in scratch blocks of the pool
  // (past the engine's), so they touch no sequence.
  std::vector<int64_t> graph_batch_sizes;
  // The tensor-parallel group moving tensors on `device` (NCCL on CUDA, gloo
  // on the test device), for weights of a TP shard (tp_size > 1); null at
  // TP 1. Its ranks step together: every rank runs each step. Partial sums
  // (row-parallel outputs, the vocab-parallel embedding) are all-gathered
  // and added in rank order, as the CPU engine does, so a row's sum does
  // not depend on the other rows. Decode graphs are not taken under TP.
  comm::ProcessGroup* tp = nullptr;
};

// Bytes the weights take on the device in `dtype` (quantised linear layers
// as their int8 values or E4M3 codes and fp32 scales).
int64_t DeviceWeightBytes(const InferenceWeights& weights, DType dtype);

// The linear layers' weights on the device (codes and scales where
// quantised), and the same weights dense in `dtype`: the log's figures.
struct LinearWeightBytes {
  int64_t stored = 0, dense = 0;
};
LinearWeightBytes DeviceLinearWeightBytes(const InferenceWeights& weights,
                                          DType dtype);

// "int8" or "FP8 (E4M3)" when the linear layers are quantised; else "".
const char* LinearWeightsFormat(const InferenceWeights& weights);

// How DeviceStep::CreateRandom leaves the linear layers: dense, or quantised
// on the device as serve --quantize int8 | fp8 | fp8-per-tensor does.
enum class RandomQuantize { kNone, kInt8, kFp8PerChannel, kFp8PerTensor };
// From --quantize's value ("" none); InvalidArgument naming the flag.
absl::StatusOr<RandomQuantize> RandomQuantizeFromFlag(const std::string& value);

// The linear layers' bytes of CreateRandom's weights for `shapes`.
LinearWeightBytes RandomLinearWeightBytes(const InferenceWeights& shapes,
                                          DType dtype, RandomQuantize quantize);

// The memory the step may use under `options` (see memory_bytes); -1 for no
// bound.
absl::StatusOr<int64_t> DeviceMemoryFor(const DeviceStepOptions& options);

// OK when weights and `kv_blocks` blocks of `shape` fit in `memory_bytes`
// (-1: no bound); else an error with the figures, naming `what` (the
// checkpoint) and the device.
absl::Status CheckFitsDevice(const InferenceWeights& weights,
                             const KvCacheShape& shape, int64_t kv_blocks,
                             const DeviceStepOptions& options,
                             int64_t memory_bytes, const std::string& what);

// The weights of `config` (TP 1, PP 1) with shapes, norms (weights one,
// biases zero) and biases (zero) but no linear or embedding values: the
// host side of a model whose values DeviceStep::CreateRandom makes on the
// device. Learned position embeddings get small random values.
InferenceWeights WeightShapes(const gpt::GPTConfig& config);

class DeviceStep {
 public:
  // Copies the weights (one TP shard of a PP 1 model with options.tp;
  // linear layers dense, int8 or FP8: quantised ones stay one byte a weight
  // on the device and run through ops::Int8Gemm / ops::Fp8WeightGemm, which
  // decode the weights inside the GEMM's loads) to the device and allocates
  // a pool of `kv_blocks` blocks of `shape` there, after CheckFitsDevice
  // (nothing is allocated when they do not fit).
  static absl::StatusOr<std::unique_ptr<DeviceStep>> Create(
      const InferenceWeights& weights, const KvCacheShape& shape,
      int64_t kv_blocks, const DeviceStepOptions& options,
      const std::string& what = "the model");

  // Test-only: as Create, for weights from WeightShapes, every linear and
  // embedding value drawn uniformly (standard deviation 0.02, from `seed`)
  // one tensor at a time on the host and copied over, so no whole copy of
  // the model exists on the host (for an 8B-shaped model on a GPU machine
  // that has no checkpoint).
  // With `quantize`, each linear layer is drawn dense, quantised on the
  // device (ops::QuantizeRowsInt8 / QuantizeWeightFp8) and the dense copy
  // dropped, so an 8B-shaped model's int8 or FP8 decode can be measured.
  static absl::StatusOr<std::unique_ptr<DeviceStep>> CreateRandom(
      const InferenceWeights& shapes, const KvCacheShape& shape,
      int64_t kv_blocks, const DeviceStepOptions& options, uint64_t seed,
      RandomQuantize quantize = RandomQuantize::kNone);

  // The whole model over the rows (ModelRunner::Run's contract for one
  // stage holding every layer): keys and values written into the pool
  // through the rows' tables; returns the logits of rows.logit_rows, fp32
  // [logit rows, vocab_size], on the host.
  absl::StatusOr<std::vector<float>> Run(const StepRows& rows);

  const DeviceStepOptions& options() const { return options_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  // Decode steps replayed from a graph so far.
  int64_t graph_replays() const { return graph_replays_; }
  // Rows that went through flash prefill attention so far.
  int64_t flash_prefill_rows() const { return flash_prefill_rows_; }
  int64_t pool_bytes() const { return pool_bytes_; }

 private:
  struct Linear {
    enum Format { kDense, kInt8, kFp8 };
    Format format = kDense;
    // [out, in]: options.dtype (dense), int8 values, or E4M3 codes (int8).
    Tensor weight;
    Tensor scales;  // [out] fp32 (quantised formats), or undefined
    Tensor bias;    // [out] fp32, or undefined
  };
  struct Norm {
    Tensor weight, bias;  // fp32; bias undefined for RMSNorm
  };
  // An MoE layer's weights (router and expert bias fp32, experts in
  // options.dtype): empty experts for a dense layer.
  struct Moe {
    ops::MoeRouterOptions router;
    Linear router_gate;  // [experts, hidden] fp32
    Tensor expert_bias;  // [experts] fp32, or undefined
    std::vector<Linear> fc1, fc2;
    Linear shared_fc1, shared_fc2;  // undefined weight: no shared expert
    Linear shared_gate;             // [1, hidden] fp32, or undefined
  };
  struct Layer {
    Norm ln1, ln2, q_norm, k_norm;
    Linear qkv, proj, fc1, fc2;
    Moe moe;
  };

  DeviceStep() = default;
  // Random values instead of the weights' own when `seed` is given.
  static absl::StatusOr<std::unique_ptr<DeviceStep>> Make(
      const InferenceWeights& weights, const KvCacheShape& shape,
      int64_t kv_blocks, const DeviceStepOptions& options,
      const std::string& what, const uint64_t* seed, RandomQuantize quantize);
  absl::Status Gemm(const Tensor& x, const Linear& lin, Tensor* y) const;
  // x [n, ...] overwritten with the sum of every TP rank's x, in rank order.
  absl::Status SumOverTp(Tensor* x) const;
  // A row-parallel layer: y = (sum over TP of x W^T) + bias.
  absl::Status RowParallelGemm(const Tensor& x, const Linear& lin,
                               Tensor* y) const;
  absl::Status ApplyNorm(const Norm& norm, const Tensor& x, Tensor* y) const;
  // 0, or the captured batch size a decode step of `rows` pads to.
  int64_t GraphBatchFor(const StepRows& rows) const;
  // How a step's rows attend: rows [0, paged_rows) through the paged
  // kernel; the rest through flash attention as one packed sequence whose
  // first_key (int32 [1, rows - paged_rows], uploaded to the device once a
  // step for every layer's call) starts each request's rows at its own
  // first row, or its window's start.
  struct AttentionPlan {
    int64_t paged_rows = 0;
    Tensor first_key;
  };
  // The model over device inputs (ints: tokens, positions, slots [n each],
  // logit rows [l]; tables [n, width]): the logits [l, vocab_rows].
  absl::StatusOr<Tensor> Forward(const Tensor& ints, const Tensor& tables,
                                 int64_t n, int64_t l,
                                 const AttentionPlan& plan);
  // A decode step of b rows from host inputs, through its graph.
  absl::StatusOr<Tensor> RunGraph(int64_t b, const Tensor& ints,
                                  const Tensor& tables);
  absl::Status RunLayer(int i, const Tensor& positions, const Tensor& slots,
                        const Tensor& tables, const AttentionPlan& plan,
                        Tensor* x);
  // Attention of q [n, heads, d] over layer i's pool (k, v [n, groups, d]
  // are the rows' own, already in the pool) into ctx [n, heads, d] fp32.
  absl::Status Attend(int i, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& positions, const Tensor& tables,
                      const AttentionPlan& plan, Tensor* ctx) const;
  // The MoE MLP of ln [n, hidden] into y [n, hidden] fp32.
  absl::Status MoeMlp(const Moe& moe, const Tensor& ln, Tensor* y) const;
  // fc2(act(fc1(x))) [rows, hidden] fp32; fc2 row-parallel (summed over
  // TP) when `row_parallel`, else a whole layer (MoE experts).
  absl::Status Mlp(const Linear& fc1, const Linear& fc2, const Tensor& x,
                   Tensor* y, bool row_parallel) const;

  DeviceStepOptions options_;
  gpt::GPTConfig config_;
  int64_t local_heads_ = 0, local_groups_ = 0, vocab_rows_ = 0;
  int64_t vocab_start_ = 0;
  int tp_size_ = 1;
  KvCacheShape shape_;
  Tensor word_embeddings_, position_embeddings_, head_;
  Norm final_norm_;
  std::vector<Layer> layers_;
  std::vector<Tensor> k_pool_, v_pool_;  // per layer
  int64_t weight_bytes_ = 0, pool_bytes_ = 0;
  int64_t kv_blocks_ = 0;          // The engine's; scratch blocks follow.
  int64_t graph_table_width_ = 0;  // Blocks of the longest sequence.
  struct Graph {
    Tensor ints, tables;  // Static inputs, copied into before a replay.
    Tensor logits;        // The graph's output.
    DeviceGraph graph;
  };
  std::map<int64_t, Graph> graphs_;
  std::set<int64_t> graph_failed_;
  int64_t graph_replays_ = 0;
  int64_t flash_prefill_rows_ = 0;
};

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_DEVICE_STEP_H_
