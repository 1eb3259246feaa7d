#include "tools/flags/eval_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(int32_t, eval_iters, 10,
          "Micro-batches of the valid and test splits to evaluate (with "
          "--prompt: only when given).");
ABSL_FLAG(std::string, prompt, "", "Text to continue (generation mode).");
ABSL_FLAG(std::string, prompt_ids, "",
          "Token ids to continue, e.g. '1 5 9' (generation mode, bypassing "
          "the tokenizer); also prints the prompt's next-token loss.");
ABSL_FLAG(bool, output_ids, false,
          "Print the generated token ids on one line instead of text.");
ABSL_FLAG(int32_t, max_new_tokens, 64, "Tokens to generate at most.");
ABSL_FLAG(double, temperature, 1.0,
          "Sampling temperature; 0 is greedy (the most likely token).");
ABSL_FLAG(int32_t, top_k, 0, "Sample among the k most likely tokens (0: all).");
ABSL_FLAG(double, top_p, 0.0,
          "Sample among the most likely tokens whose probabilities sum to p "
          "(0: all).");
ABSL_FLAG(bool, no_kv_cache, false,
          "Recompute the whole prefix for every new token (for comparison).");
