// A trained GPT's checkpoint evaluated from another workspace through
// @megatron_cpp//training:checkpoint_eval, as tools/eval evaluates it:
// validation and test loss, then a greedy continuation of a prompt.
//   eval_gpt CHECKPOINT_DIR [PROMPT]
// Under @megatron_cpp//tools:launch every process runs this same program
// (any TP x PP x DP layout loads any checkpoint).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "glog/logging.h"
#include "training/checkpoint_eval.h"
#include "training/eval_config.pb.h"
#include "training/job.h"

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (argc < 2) {
    std::fprintf(stderr, "usage: eval_gpt CHECKPOINT_DIR [PROMPT]\n");
    return 2;
  }
  // Every field not set here defaults as its Megatron flag does; the model
  // comes from the checkpoint.
  mcc::training::EvalConfig config;
  config.mutable_run()->set_load(argv[1]);
  config.mutable_run()->set_eval_iters(4);
  config.mutable_run()->set_num_threads(1);
  config.set_prompt(argc > 2 ? argv[2] : "The");
  config.set_temperature(0);  // Greedy.
  config.set_max_new_tokens(16);

  auto plan = mcc::training::PlanCheckpointEval(
      config, mcc::training::WorldSizeFromEnvironment());
  if (!plan.ok()) {
    std::fprintf(stderr, "eval_gpt: %s\n", plan.status().ToString().c_str());
    return 2;
  }
  mcc::training::ConfigureThreads(config.run());
  auto result = mcc::training::EvaluateCheckpoint(*plan);
  if (!result.ok()) {
    LOG(ERROR) << "evaluation failed: " << result.status();
    return 1;
  }
  if (!result->reported) return 0;  // Not the logging rank.
  for (const mcc::training::SplitLoss& split : result->splits) {
    if (!split.empty) {
      std::printf("%s loss %.4f | perplexity %.2f\n", split.split.c_str(),
                  split.loss, std::exp(std::min(split.loss, 20.0)));
    }
  }
  std::printf("continuation: %s\n", result->generation->text.c_str());
  return 0;
}
