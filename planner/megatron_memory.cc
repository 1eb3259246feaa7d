#include "planner/megatron_memory.h"

#include <algorithm>

namespace mcc {
namespace planner {

MegatronMemory MegatronTheoreticalMemory(const JobSpec& job, const Layout& l,
                                         int num_microbatches) {
  return MegatronFormulaForFirstStage(
      job, l, num_microbatches,
      static_cast<double>(job.model.num_layers) / l.pp);
}

MegatronMemory MegatronFormulaForFirstStage(const JobSpec& job, const Layout& l,
                                            int num_microbatches,
                                            double first_stage_layers) {
  const gpt::GPTConfig& c = job.model;
  const double h = static_cast<double>(c.hidden_size);
  const double f = static_cast<double>(c.ffn());
  const double gated = c.activation == gpt::Activation::kSwiGLU ? 1.5 : 1.0;
  const double groups_ratio =
      static_cast<double>(c.query_groups()) / c.num_attention_heads;
  // Per layer: QKV and projection 2h^2(1 + g/a), MLP 2hf (x1.5 gated), two
  // norms' weights and biases 4h; the final norm's 2h once, shared over the
  // stages as the formula shares the whole block.
  const double layer_params =
      2 * h * h * ((1 + groups_ratio) + (f / h) * gated + 2 / h);
  const double final_norm = 2 * h;
  const double embedding = h * static_cast<double>(c.padded_vocab_size(l.tp));
  // The first stage's layers, with the embedding; untied weights add the
  // output layer there only without pipelining.
  double most_loaded =
      (first_stage_layers * layer_params + final_norm / l.pp + embedding) /
      l.tp;
  if (c.untie_embeddings_and_output_weights && l.pp == 1) {
    most_loaded += embedding / l.tp;
  }
  const bool distributed = l.zero != ZeroStage::kNone;
  const double bytes_per_param = distributed ? 6 + 12.0 / l.dp : 18;
  MegatronMemory m;
  m.weights_and_optimizer = most_loaded * bytes_per_param;

  const double sbh = static_cast<double>(c.seq_length) * l.micro_batch * h;
  // The first stage's layers for each of the PP micro-batches in flight
  // (the formula's L when the split is even).
  double act = sbh * (18 + 4 * f / h) * first_stage_layers * l.pp;
  const double sb = static_cast<double>(c.seq_length) * l.micro_batch;
  act += 8 * sb * l.pp;  // embedding input
  act += sbh * l.pp;     // embedding dropout
  if (l.virtual_stages > 1) {
    act *= 1 + (l.pp - 1.0) / (l.pp * l.virtual_stages);
  } else if (l.pp > 1 && num_microbatches > 0) {
    act *= std::min(1.0, static_cast<double>(num_microbatches) / l.pp);
  }
  if (l.pp == 1) {
    act += sbh * 4 * (1 + c.padded_vocab_size(l.tp) / h);
  }
  m.activations = act / l.tp;
  return m;
}

}  // namespace planner
}  // namespace mcc
