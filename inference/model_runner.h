#ifndef INFERENCE_MODEL_RUNNER_H_
#define INFERENCE_MODEL_RUNNER_H_

// One rank's forward pass of a batch of token rows from many sequences, each
// at its own position, through a paged KV cache: the engine's model step.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "inference/inference_weights.h"
#include "inference/paged_kv_cache.h"
#include "inference/row_gemm.h"

namespace mcc {
namespace inference {

class DeviceStep;

// The rows of one step, as every rank of the job sees them.
struct StepRows {
  std::vector<int64_t> tokens;     // [rows]
  std::vector<int64_t> positions;  // [rows]
  std::vector<int32_t> table;      // [rows]: index into tables
  std::vector<BlockTable> tables;
  // Rows whose next-token logits are wanted, ascending.
  std::vector<int32_t> logit_rows;
  int64_t rows() const { return static_cast<int64_t>(tokens.size()); }
};

// The cache geometry `weights` need: this rank's layers and kv heads, in
// blocks of `block_size` positions.
KvCacheShape CacheShapeFor(const InferenceWeights& weights,
                           int64_t block_size = 16);

// Holds the weights and this rank's KV cache. Every row is computed alone
// (fixed-order kernels, tensor-parallel sums in rank order), so a row's
// results do not depend on the other rows or on how a prompt is split into
// chunks: greedy decoding is bit-identical batched or alone. Not
// thread-safe; all ranks of the tensor-parallel group must call Run with the
// same rows (it makes collectives on `tp`).
class ModelRunner {
 public:
  // `tp` (may be null for one rank) outlives the runner.
  ModelRunner(InferenceWeights weights, comm::ProcessGroup* tp,
              PagedKvCache cache);
  // The model on a device (device_step.h), which holds the weights and the
  // KV pool; `cache` keeps the pool's block bookkeeping
  // (PagedKvCache::BookkeepingOnly, the device step's block count). One
  // process holding the whole model.
  ModelRunner(InferenceWeights weights, std::unique_ptr<DeviceStep> device,
              PagedKvCache cache);
  ~ModelRunner();

  // The stage's layers over the rows: the first stage embeds rows.tokens
  // (hidden is output only), others take *hidden [rows, hidden_size] from
  // the previous stage. *hidden ends as this stage's output. On the last
  // stage returns the logits of rows.logit_rows, fp32 [logit rows,
  // vocab_size] on every TP rank (the padding dropped); elsewhere an empty
  // vector. Keys and values of every row are written into the cache at its
  // position, through its table (blocks the caller allocated).
  absl::StatusOr<std::vector<float>> Run(const StepRows& rows,
                                         std::vector<float>* hidden);

  // The weights given at construction, except that the linear layers'
  // values (weight, q) and the output layer's (output, or word_embeddings
  // when tied, on the last stage) are empty: the runner keeps them packed
  // for RowGemm (shapes, scales and biases stay).
  const InferenceWeights& weights() const { return weights_; }
  // Bytes of the linear layers' packed values and scales, all layers (on the
  // device: every weight's bytes there).
  int64_t linear_weight_bytes() const;
  // The device step, or null for the CPU engine.
  const DeviceStep* device_step() const { return device_.get(); }
  PagedKvCache& cache() { return cache_; }

 private:
  absl::Status Embed(const StepRows& rows, std::vector<float>* x);
  absl::Status Layer(int i, const StepRows& rows,
                     const std::vector<const int32_t*>& tables,
                     std::vector<float>* x);
  absl::StatusOr<std::vector<float>> Logits(const StepRows& rows,
                                            const std::vector<float>& x);
  // Sums `v` over the TP group in rank order (the same bits on every rank,
  // for any length).
  absl::Status SumOverTp(std::vector<float>* v);
  // Over `width` elements a row (0: hidden_size); y may be x.
  void Norm(const NormWeights& norm, const float* x, int64_t rows, float* y,
            int64_t width = 0) const;
  void Rotate(float* x, int64_t rows, int64_t heads_per_row,
              const std::vector<int64_t>& positions) const;

  InferenceWeights weights_;
  // The linear layers' and the output layer's weights packed for RowGemm at
  // construction (kept beside weights_, which callers may read).
  struct PackedLayer {
    RowGemmWeights qkv, proj, fc1, fc2;
    // An MoE layer's router, experts (one each) and shared expert.
    RowGemmWeights router, shared_fc1, shared_fc2;
    std::vector<RowGemmWeights> expert_fc1, expert_fc2;
  };
  // An MoE layer's MLP of n rows of ln into out [n, hidden], one row at a
  // time (a row's experts and sums never depend on the rows around it).
  absl::Status MoeRows(const LayerWeights& lw, const PackedLayer& pl,
                       const float* ln, int64_t n, float* out) const;
  std::vector<PackedLayer> packed_;
  RowGemmWeights packed_head_;
  // A layer's activations, kept between steps (see Buffer in the .cc).
  struct Scratch {
    std::vector<float> ln, qkv, q, k, v, ctx, attn, fc1, act, mlp;
  };
  Scratch scratch_;
  comm::ProcessGroup* tp_;
  PagedKvCache cache_;
  std::vector<float> cos_, sin_;  // [max_positions, head_dim / 2] (RoPE)
  std::unique_ptr<DeviceStep> device_;
};

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_MODEL_RUNNER_H_
