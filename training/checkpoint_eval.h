#ifndef TRAINING_CHECKPOINT_EVAL_H_
#define TRAINING_CHECKPOINT_EVAL_H_

// Evaluating a trained checkpoint, as tools/eval does it, callable from any
// workspace: validation and test loss and perplexity over eval_iters
// micro-batches (split as training splits the data), and/or a continuation
// of a prompt through the inference engine (paged KV cache, the same
// arithmetic under every layout). The model configuration comes from the
// checkpoint's metadata, the parallel layout (TP, PP, DP) from the config
// and the launcher's world, so any layout evaluates any checkpoint.
//
//   EvalPlan plan = *PlanCheckpointEval(config, WorldSizeFromEnvironment());
//   EvalResult result = *EvaluateCheckpoint(plan);   // collective
//
// Every rank of the world calls EvaluateCheckpoint; the logging rank's
// result holds the figures (the others' `reported` is false).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/config.pb.h"
#include "core/dtype.h"
#include "data/tokenizer.h"
#include "models/gpt/gpt_config.h"
#include "training/eval_config.pb.h"

namespace mcc {
namespace training {

// What the checks before any process group forms find out.
struct EvalPlan {
  EvalConfig config;
  checkpoint::ModelConfig stored;  // The checkpoint's model metadata.
  std::string checkpoint_path;     // DIR/iter_N
  gpt::GPTConfig model;
  DType dtype = DType::kFloat32;
  // For a text prompt, text output and text data; null with prompt ids and
  // output ids, and with mock data (or no evaluation).
  std::unique_ptr<data::Tokenizer> tokenizer;
  bool ids_in = false;  // The prompt is token ids.
  std::vector<int64_t> prompt_ids;
  int64_t max_new_tokens = 0;  // Capped by the model's positions.
  bool evaluate = false;
  bool generate = false;
};

// Every check that needs no process group: the checkpoint opens, given
// model fields agree with it, the layout holds the model for `world_size`
// processes, the data and tokenizer files exist, the sampling settings are
// in range, the prompt fits. Errors name the field (as its flag, dashed).
absl::StatusOr<EvalPlan> PlanCheckpointEval(const EvalConfig& config,
                                            int world_size);

// One split's evaluation.
struct SplitLoss {
  std::string split;   // "validation" or "test"
  bool empty = false;  // The split holds no data.
  double loss = 0;     // Mean next-token loss over the micro-batches.
};

// One continuation.
struct Generation {
  std::vector<int64_t> tokens;
  std::string text;             // Decoded, unless the output is ids.
  bool stopped_at_eod = false;  // Else the token limit.
  int64_t prompt_tokens = 0;
  double prefill_ms = 0;
  double decode_tokens_per_s = 0;
  // With prompt ids of two or more tokens: the prompt's mean next-token
  // loss over `prompt_loss_predictions` predictions.
  std::optional<double> prompt_loss;
  int64_t prompt_loss_predictions = 0;
};

struct EvalResult {
  bool reported = false;  // This is the logging rank: the fields are set.
  std::vector<SplitLoss> splits;
  std::optional<Generation> generation;
};

// Joins the world, loads the checkpoint into this rank's part of the
// layout, then evaluates and/or generates as the plan says. Collective over
// the launcher's world; rank 0 plans the generation steps and the other
// ranks follow them.
absl::StatusOr<EvalResult> EvaluateCheckpoint(const EvalPlan& plan);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_CHECKPOINT_EVAL_H_
