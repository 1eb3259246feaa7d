#include "training/testing/tiny_run.h"

#include <filesystem>

#include "absl/time/clock.h"
#include "training/run_options.h"

namespace mcc {
namespace training {
namespace testing {

TrainConfig TinyRunConfig(const std::string& dir) {
  std::filesystem::create_directories(dir);
  TrainConfig config;
  config.set_mock_data(true);
  config.set_vocab_size(64);
  config.set_num_layers(2);
  config.set_hidden_size(16);
  config.set_num_attention_heads(2);
  config.set_seq_length(16);
  config.set_micro_batch_size(2);
  config.set_global_batch_size(4);
  config.set_train_iters(6);
  config.set_eval_iters(0);
  config.set_log_interval(1);
  config.set_num_threads(1);
  config.set_device("cpu");
  return config;
}

absl::Status RunTiny(const TrainConfig& config, const RunHooks& hooks) {
  auto exit = ExitConditions::Create(*ExitOptionsFromConfig(config),
                                     absl::Now(), nullptr);
  if (!exit.ok()) return exit.status();
  return Run(config, exit->get(), hooks);
}

}  // namespace testing
}  // namespace training
}  // namespace mcc
