#ifndef TOOLS_FLAGS_EVAL_FLAGS_H_
#define TOOLS_FLAGS_EVAL_FLAGS_H_

// The flags of eval alone (generation and --eval-iters); a binary reads
// them only through its EvalConfig (eval_config_from_flags.h). The model,
// data and layout flags are train's (training_flags.h).

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(int32_t, eval_iters);
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, prompt_ids);
ABSL_DECLARE_FLAG(bool, output_ids);
ABSL_DECLARE_FLAG(int32_t, max_new_tokens);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(double, top_p);
ABSL_DECLARE_FLAG(bool, no_kv_cache);

#endif  // TOOLS_FLAGS_EVAL_FLAGS_H_
