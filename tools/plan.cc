// tools/plan: predicts, before a job starts, every rank's memory and the
// step time of each way to run it (TP x PP (virtual stages) x DP x CP x
// ZeRO x recomputation x micro-batch) on a cluster, and ranks them.
//
//   plan --preset bench --global-batch-size 16 --device cpu
//        --devices-per-node 4
//   plan --hf-config config.json --seq-length 8192 --global-batch-size 1024
//        --device h100 --devices-per-node 8 --nnodes 4 --bf16
//   plan ... --explain tp2sp.pp2.dp2.cp1.z1.rnone.mb4 [--json]
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"
#include "planner/hf_config.h"
#include "planner/layout_search.h"
#include "planner/plan_report.h"
#include "tools/flags/megatron_args.h"
#include "tools/flags/presets.h"
#include "tools/flags/runtime_flags.h"
#include "tools/flags/train_config_from_flags.h"
#include "tools/flags/training_flags.h"
#include "tools/plan_job.h"
#include "training/job.h"
#include "training/model_from_config.h"
#include "training/run_options.h"

ABSL_FLAG(std::string, preset, "",
          "Named model settings for unset flags, as train's: 'bench'.");
ABSL_FLAG(std::string, hf_config, "",
          "A Hugging Face config.json (gpt2, llama, mistral, qwen2) instead of "
          "the model flags; --seq-length overrides its max positions.");
ABSL_FLAG(int64_t, global_batch_size, 0,
          "Sequences per step (required unless a preset or --explain's "
          "micro-batch x DP gives it).");
ABSL_FLAG(std::string, optimizer, "adam", "adam (2 fp32 states) or sgd (1).");
ABSL_FLAG(bool, overlap_grad_reduce, false, "As train's flag.");
ABSL_FLAG(bool, overlap_param_gather, false, "As train's flag.");
ABSL_FLAG(int64_t, ddp_bucket_size, 40000000, "As train's flag (elements).");
ABSL_FLAG(std::string, device, "cpu",
          "a100, h100 or h200 (the shipped datasheet table), or cpu: measure "
          "this machine now (GEMM, attention, memory and loopback rates).");
ABSL_FLAG(int32_t, devices_per_node, 1, "Devices (ranks) per node.");
ABSL_FLAG(int32_t, nnodes, 1, "Nodes, as tools/launch's --nnodes.");
ABSL_FLAG(int32_t, top, 10, "Layouts to print.");
ABSL_FLAG(std::string, explain, "",
          "Print the full breakdown of this layout (a name from the table, "
          "e.g. tp2sp.pp2v2.dp2.cp1.z1.rselective.mb4).");
ABSL_FLAG(bool, json, false, "Print JSON instead of text.");
ABSL_FLAG(bool, include_unsupported, false,
          "Also rank layouts train cannot run (CP with attention dropout, "
          "torchtitan's op-level recomputation).");
ABSL_FLAG(bool, include_not_fitting, false,
          "Also list layouts that do not fit in device memory.");
// Train's own flags the planner reads (mapped onto the TrainConfig by name).
ABSL_FLAG(bool, use_precision_aware_optimizer, false,
          "As train's: Adam's moments (and 16-bit weights' main copy) in "
          "--exp-avg-dtype, --exp-avg-sq-dtype, --main-params-dtype; only "
          "layouts with sharded state are planned with it.");
ABSL_FLAG(std::string, main_params_dtype, "fp32", "As train's: fp32 or fp16.");
ABSL_FLAG(std::string, exp_avg_dtype, "fp32",
          "As train's: fp32, bf16 or fp16.");
ABSL_FLAG(std::string, exp_avg_sq_dtype, "fp32",
          "As train's: fp32, bf16 or fp16.");
ABSL_FLAG(std::string, pipeline_schedule_file, "",
          "As train's: a CSV schedule table, planned (as the 'sfile' "
          "schedule) for the layouts of its shape: the pipeline size, "
          "virtual stages and micro-batch count of the parallel flags and "
          "--global-batch-size.");
ABSL_FLAG(
    std::string, micro_batches, "",
    "Comma-separated micro-batch sizes to try (default 1, 2, 4, ... 64).");

namespace mcc {
namespace tools {
namespace {

constexpr int kFlagError = 2;

absl::StatusOr<gpt::GPTConfig> ModelFromFlags(
    const training::TrainConfig& config,
    const std::set<std::string>& explicitly_set) {
  if (!absl::GetFlag(FLAGS_hf_config).empty()) {
    auto c = planner::ReadHuggingFaceConfig(absl::GetFlag(FLAGS_hf_config));
    if (c.ok() && explicitly_set.count("seq_length")) {
      c->seq_length = absl::GetFlag(FLAGS_seq_length);
    }
    return c;
  }
  int64_t vocab = absl::GetFlag(FLAGS_vocab_size);
  if (vocab <= 0) {
    vocab =
        absl::GetFlag(FLAGS_tokenizer_type) == "GPT2BPETokenizer" ? 50257 : 257;
  }
  return training::GPTConfigFromConfig(config, vocab);
}

int Run(const std::set<std::string>& explicitly_set) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "plan: %s\n", std::string(s.message()).c_str());
    return kFlagError;
  };
  absl::StatusOr<training::TrainConfig> config = flags::TrainConfigFromFlags();
  if (!config.ok()) return fail(config.status());
  auto model = ModelFromFlags(*config, explicitly_set);
  if (!model.ok()) return fail(model.status());
  const DType dtype = DTypeFromConfig(*config);
  TrainSettings settings;
  settings.adam = absl::GetFlag(FLAGS_optimizer) != "sgd";
  settings.overlap_grad_reduce = absl::GetFlag(FLAGS_overlap_grad_reduce);
  settings.overlap_param_gather = absl::GetFlag(FLAGS_overlap_param_gather);
  settings.overlap_p2p = !absl::GetFlag(FLAGS_no_overlap_p2p_communication);
  settings.bucket_bytes = absl::GetFlag(FLAGS_ddp_bucket_size) * 4;
  settings.global_batch = absl::GetFlag(FLAGS_global_batch_size);
  std::optional<planner::Layout> explain;
  if (!absl::GetFlag(FLAGS_explain).empty()) {
    auto l = planner::ParseLayout(absl::GetFlag(FLAGS_explain));
    if (!l.ok()) return fail(l.status());
    explain = *l;
  }
  if (settings.global_batch <= 0) {
    if (explain) {
      settings.global_batch = explain->micro_batch * explain->dp;
    } else {
      return fail(absl::InvalidArgumentError(
          "--global-batch-size is required (sequences per step)"));
    }
  }
  {
    // The precision flags as train checks them, for the sharded layouts
    // the search plans them on (CheckLayout refuses the others).
    training::TrainConfig sharded = *config;
    sharded.set_use_distributed_optimizer(true);
    sharded.set_global_batch_size(settings.global_batch);
    const int world =
        absl::GetFlag(FLAGS_devices_per_node) * absl::GetFlag(FLAGS_nnodes);
    const int model_parallel = config->tensor_model_parallel_size() *
                               config->pipeline_model_parallel_size() *
                               config->context_parallel_size();
    int microbatches = 1;
    if (!config->pipeline_schedule_file().empty()) {
      if (model_parallel < 1 || world % model_parallel != 0) {
        return fail(absl::InvalidArgumentError(
            "--pipeline-schedule-file: the parallel flags do not divide "
            "--devices-per-node x --nnodes"));
      }
      auto batches = training::PlanBatches(sharded, world / model_parallel);
      if (!batches.ok()) return fail(batches.status());
      microbatches = batches->num_microbatches;
    }
    absl::Status s =
        ReadPrecisionAndScheduleFile(sharded, microbatches, &settings);
    if (!s.ok()) return fail(s);
  }
  // The CPU probe measures under the OpenMP wait policy train runs with.
  if (absl::GetFlag(FLAGS_device) == "cpu") training::UsePassiveOpenMpWait();
  auto cluster = MakeCluster(absl::GetFlag(FLAGS_device),
                             absl::GetFlag(FLAGS_devices_per_node),
                             absl::GetFlag(FLAGS_nnodes), *model, dtype);
  if (!cluster.ok()) return fail(cluster.status());
  const planner::JobSpec job = MakeJobSpec(*model, dtype, settings, *cluster);

  if (explain) {
    auto p = planner::Predict(job, *explain);
    if (!p.ok()) return fail(p.status());
    std::fputs(absl::GetFlag(FLAGS_json)
                   ? planner::FormatJson(job, {*p}).c_str()
                   : planner::FormatExplain(job, *p).c_str(),
               stdout);
    return 0;
  }
  planner::SearchOptions options;
  options.include_unsupported = absl::GetFlag(FLAGS_include_unsupported);
  options.include_not_fitting = absl::GetFlag(FLAGS_include_not_fitting);
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_micro_batches),
                                            ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(b, &v) || v < 1) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("--micro-batches: '", b, "' is not a positive count")));
    }
    options.micro_batches.push_back(v);
  }
  std::vector<planner::Prediction> all = planner::SearchLayouts(job, options);
  if (all.empty()) {
    std::fprintf(stderr,
                 "plan: no layout divides the job and fits (try "
                 "--include-not-fitting or --include-unsupported)\n");
    return 1;
  }
  const size_t top = std::max(1, absl::GetFlag(FLAGS_top));
  if (all.size() > top) all.resize(top);
  std::fputs(absl::GetFlag(FLAGS_json) ? planner::FormatJson(job, all).c_str()
                                       : planner::FormatTable(job, all).c_str(),
             stdout);
  return 0;
}

}  // namespace
}  // namespace tools
}  // namespace mcc

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // The probe's thread-pool notes are not output.
  auto parsed = mcc::flags::ParseMegatronArgs(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "plan: %s\n",
                 std::string(parsed.status().message()).c_str());
    return mcc::tools::kFlagError;
  }
  mcc::flags::ApplyRuntimeFlags();
  for (const std::string& arg : parsed->positional) {
    if (arg == "help" || arg == "-h") {
      std::printf("usage: plan [--flag value ...]\n%s\n",
                  mcc::flags::Usage().c_str());
      return 0;
    }
  }
  if (!parsed->positional.empty()) {
    std::fprintf(stderr, "plan: unexpected argument '%s'\n",
                 parsed->positional[0].c_str());
    return mcc::tools::kFlagError;
  }
  absl::Status s = mcc::flags::ApplyPreset(absl::GetFlag(FLAGS_preset),
                                           parsed->explicitly_set,
                                           /*skip_undefined=*/true);
  if (!s.ok()) {
    std::fprintf(stderr, "plan: %s\n", std::string(s.message()).c_str());
    return mcc::tools::kFlagError;
  }
  return mcc::tools::Run(parsed->explicitly_set);
}
