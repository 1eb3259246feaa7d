#include "planner/published_runs.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"
#include "models/gpt/model_flops.h"
#include "planner/megatron_memory.h"
#include "planner/memory_model.h"
#include "planner/step_time_model.h"

namespace mcc {
namespace planner {
namespace {

// The dense bf16 peak both publications divide by (H100 SXM datasheet).
constexpr double kH100PeakTflops = 989;

constexpr char kMegatronReadme[] =
    "github.com/NVIDIA/Megatron-LM README.md, 'Training Speed and "
    "Scalability', added in commit f2e5db402c44 (2024-07-15, Megatron-Core "
    "r0.8.0), still in d98e8a64ddf3";
constexpr char kMegatronAssumed[] =
    "not stated: recomputation (none assumed), "
    "distributed optimizer (assumed: --overlap-param-gather needs it), "
    "sequence parallelism with TP (assumed: --tp-comm-overlap needs it), "
    "GELU MLP of 4h, untied embeddings (the stated sizes count two "
    "embedding tables), gradients reduced in fp32 (Megatron's default with "
    "bf16), DGX H100 nodes (8 GPUs on NVLink, one 400 Gb/s InfiniBand port "
    "a GPU); micro-batch and virtual pipeline stages left to the planner";

JobSpec MegatronJob(int layers, int64_t hidden, int heads, int64_t batch,
                    int gpus) {
  JobSpec job;
  gpt::GPTConfig& c = job.model;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.num_attention_heads = heads;
  c.vocab_size = 131072;
  c.make_vocab_size_divisible_by = 128;
  c.seq_length = 4096;
  c.untie_embeddings_and_output_weights = true;
  job.dtype = DType::kBFloat16;
  job.global_batch = batch;
  job.adam = true;
  job.overlap_grad_reduce = true;
  job.overlap_param_gather = true;
  job.overlap_tp_comm = true;
  job.overlap_p2p = true;
  job.cluster.device = *ShippedDevice("h100");
  job.cluster.devices_per_node = 8;
  job.cluster.nodes = gpus / 8;
  return job;
}

Layout MegatronLayout(int tp, int pp, int dp) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.sequence_parallel = tp > 1;
  l.zero = dp > 1 ? ZeroStage::kOptimizer : ZeroStage::kNone;
  l.recompute = Recompute::kNone;
  l.micro_batch = 1;
  return l;
}

PublishedRun Weak(const char* size, int heads, int64_t hidden, int layers,
                  int tp, int pp, int dp, int64_t batch,
                  double tflops_per_gpu) {
  PublishedRun r;
  r.name = absl::StrCat("Megatron weak scaling ", size);
  r.source = absl::StrCat(kMegatronReadme,
                          ", images/model_table.png (per-GPU teraFLOP/s "
                          "column over the 989 TFLOP/s peak)");
  r.assumed = kMegatronAssumed;
  r.job = MegatronJob(layers, hidden, heads, batch, tp * pp * dp);
  r.layout = MegatronLayout(tp, pp, dp);
  r.search_virtual_stages = pp > 1;
  r.search_micro_batch = true;
  r.fit_by_megatron_formula = true;
  r.published_mfu = tflops_per_gpu / kH100PeakTflops;
  r.published_peak_flops = kH100PeakTflops * 1e12;
  return r;
}

// GPT-3 175B (96 layers, hidden 12288, 96 heads) with a 131,072 vocabulary,
// global batch 1152 throughout. The README states only the end points
// (47% on 96 GPUs, 42% on 4608); the points between are read off
// images/strong_scaling.png (marker centres on its log axes, about 1%
// of the value). Every GPU count is a multiple of 48 = TP 8 x PP 6, the
// model table's layout for this model and batch at 2304 GPUs, whose
// throughput the figure repeats; the layout is inferred from that.
PublishedRun Strong(int gpus, double petaflops) {
  PublishedRun r;
  r.name = absl::StrCat("Megatron GPT-3 175B strong scaling, ", gpus, " GPUs");
  r.source = absl::StrCat(kMegatronReadme,
                          ", images/strong_scaling.png (aggregate "
                          "petaFLOP/s read off the figure)");
  r.assumed = absl::StrCat(
      "TP 8 x PP 6 x DP ", gpus / 48,
      " inferred (not stated for the strong-scaling runs); ", kMegatronAssumed);
  r.job = MegatronJob(96, 12288, 96, 1152, gpus);
  r.layout = MegatronLayout(8, 6, gpus / 48);
  r.search_virtual_stages = true;
  r.search_micro_batch = true;
  r.fit_by_megatron_formula = true;
  r.published_mfu = petaflops * 1e3 / gpus / kH100PeakTflops;
  return r;
}

// torchtitan's Llama 3.1 8B on 8 H100 under FSDP (ZeRO-3), no compile, no
// Float8: benchmarks/llama3_h100_202412_torchtitan.md, Table 1 (local batch
// 2, global 16, selective activation checkpointing), torchtitan 9dec370
// (2024-12-26) whose train_configs/llama3_8b.toml sets seq_len 8192 and
// the 'op' selective policy. Their H100s are HBM2e parts with 96 GB at
// 2.4 TB/s and a 500 W limit, whose peak they do not know but place between
// the SXM's (989 TFLOP/s dense bf16) and the NVL's (H100 NVL datasheet:
// 1,671 with sparsity, 835.5 dense); the device here takes the middle, 912,
// and MFU is quoted against the SXM peak, as they quote it.
PublishedRun Torchtitan() {
  PublishedRun r;
  r.name = "torchtitan Llama 3.1 8B, FSDP, 8 GPUs";
  r.source =
      "github.com/pytorch/torchtitan benchmarks/"
      "llama3_h100_202412_torchtitan.md (commit 820504e20d11), Table 1 row "
      "FSDP; train_configs/llama3_8b.toml at 9dec370ad26b";
  r.assumed =
      "torchtitan's 'op' selective checkpointing modelled as half the "
      "matmul FLOPs and every memory-bound op recomputed (its memory as no "
      "recomputation); eager PyTorch's norms, rotary and SwiGLU counted kernel "
      "by kernel from its model code (not compiled); HBM 96 GB at "
      "2.4 TB/s from their hardware note; "
      "dense bf16 peak 912 TFLOP/s, the middle of the range their footnote "
      "gives (SXM 989, NVL 835.5); the SXM's links";
  JobSpec& job = r.job;
  gpt::GPTConfig& c = job.model;
  c.num_layers = 32;
  c.hidden_size = 4096;
  c.num_attention_heads = 32;
  c.num_query_groups = 8;
  c.ffn_hidden_size = 14336;
  c.vocab_size = 128256;
  c.seq_length = 8192;
  c.position_embedding = gpt::PositionEmbedding::kRope;
  c.normalization = gpt::Normalization::kRMSNorm;
  c.activation = gpt::Activation::kSwiGLU;
  c.untie_embeddings_and_output_weights = true;
  c.add_bias_linear = false;
  job.dtype = DType::kBFloat16;
  job.global_batch = 16;
  job.overlap_grad_reduce = true;
  job.overlap_param_gather = true;
  job.fused_elementwise = false;  // compile = false
  job.cluster.device = *ShippedDevice("h100");
  job.cluster.device.memory_bytes = 96e9;
  job.cluster.device.memory_bandwidth = 2.4e12;
  job.cluster.device.bf16_flops = (989 + 835.5) / 2 * 1e12;
  job.cluster.devices_per_node = 8;
  job.cluster.nodes = 1;
  r.layout.dp = 8;
  r.layout.zero = ZeroStage::kParameters;
  r.layout.recompute = Recompute::kSelectiveOps;
  r.layout.micro_batch = 2;
  r.published_tokens_per_gpu = 5762;
  r.published_mfu =
      5762 * gpt::TrainingFlopsPerToken(c) / (kH100PeakTflops * 1e12);
  return r;
}

}  // namespace

std::vector<PublishedRun> PublishedRuns() {
  return {
      Weak("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
      Weak("7.1B", 32, 4096, 30, 2, 1, 48, 192, 465.9),
      Weak("16B", 48, 6144, 32, 4, 1, 48, 192, 489.1),
      Weak("32B", 56, 7168, 48, 8, 1, 48, 192, 459.6),
      Weak("70B", 64, 8192, 84, 8, 2, 48, 384, 419.7),
      Weak("119B", 80, 10240, 92, 8, 4, 48, 768, 420.5),
      Weak("177B", 96, 12288, 96, 8, 6, 48, 1152, 432.8),
      Weak("314B", 128, 16384, 96, 8, 8, 48, 1536, 474.4),
      Weak("462B", 144, 18432, 112, 8, 16, 48, 3072, 459.9),
      Strong(96, 44.6),
      Strong(144, 66.7),
      Strong(288, 132.9),
      Strong(576, 263.5),
      Strong(1152, 517.4),
      Strong(2304, 997.2),  // The model table's value for the same run.
      Strong(3072, 1307),
      Strong(4608, 1908),
      Torchtitan(),
  };
}

absl::StatusOr<PublishedComparison> ComparePublished(const PublishedRun& run) {
  std::vector<int> stages = {run.layout.virtual_stages};
  if (run.search_virtual_stages) {
    stages.clear();
    const int per_stage = run.job.model.num_layers / run.layout.pp;
    for (int v = 1; v <= per_stage; ++v) {
      if (per_stage % v == 0) stages.push_back(v);
    }
  }
  std::vector<int64_t> micro_batches = {run.layout.micro_batch};
  if (run.search_micro_batch) {
    micro_batches.clear();
    for (int64_t b = 1; b <= 16; b *= 2) micro_batches.push_back(b);
  }
  // As SearchLayouts ranks: fitting first, then the shortest step.
  std::optional<Prediction> best;
  bool best_fits = false;
  absl::Status first_error = absl::OkStatus();
  for (int v : stages) {
    for (int64_t b : micro_batches) {
      Layout l = run.layout;
      l.virtual_stages = v;
      l.micro_batch = b;
      auto p = Predict(run.job, l);
      if (!p.ok()) {
        if (first_error.ok()) first_error = p.status();
        continue;
      }
      bool fits = p->fits;
      if (run.fit_by_megatron_formula) {
        fits =
            MegatronTheoreticalMemory(run.job, l, NumMicroBatches(run.job, l))
                .total() <= run.job.cluster.device.memory_bytes;
      }
      if (!best || (fits && !best_fits) ||
          (fits == best_fits && p->time.total() < best->time.total())) {
        best = *std::move(p);
        best_fits = fits;
      }
    }
  }
  if (!best) {
    return absl::InvalidArgumentError(
        absl::StrCat(run.name, ": ", first_error.message()));
  }
  PublishedComparison out;
  out.run = run;
  out.prediction = *best;
  out.fits_published_system = best_fits;
  out.predicted_tokens_per_gpu =
      best->time.tokens_per_second / run.job.cluster.world();
  out.predicted_mfu = out.predicted_tokens_per_gpu *
                      gpt::TrainingFlopsPerToken(run.job.model) /
                      run.published_peak_flops;
  out.mfu_error_points = 100 * (out.predicted_mfu - run.published_mfu);
  return out;
}

}  // namespace planner
}  // namespace mcc
