// Megatron's training loop from another workspace: the GPT of
// @megatron_cpp//models, trained by @megatron_cpp//training exactly as
// tools/train trains it, with the run described in code (or by a text
// TrainConfig given as the one argument) instead of flags. Under
// @megatron_cpp//tools:launch every process runs this same program.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "glog/logging.h"
#include "google/protobuf/text_format.h"
#include "training/job.h"
#include "training/run.h"
#include "training/run_options.h"
#include "training/train_config.pb.h"

namespace {

// The run: every field not set here defaults as its Megatron flag does.
mcc::training::TrainConfig DefaultConfig() {
  mcc::training::TrainConfig config;
  config.set_num_layers(2);
  config.set_hidden_size(64);
  config.set_train_iters(20);
  config.set_save("/tmp/train_gpt_example");
  return config;
}

}  // namespace

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  mcc::training::TrainConfig config = DefaultConfig();
  if (argc > 1) {  // A text TrainConfig replaces the one above.
    std::ifstream in(argv[1]);
    std::stringstream text;
    text << in.rdbuf();
    config.Clear();
    if (!in || !google::protobuf::TextFormat::ParseFromString(text.str(),
                                                              &config)) {
      std::fprintf(stderr, "train_gpt: cannot read TrainConfig %s\n", argv[1]);
      return 2;
    }
  }
  // The ten lines: check, set threads, stop conditions, run.
  const int world_size = mcc::training::WorldSizeFromEnvironment();
  absl::Status status = mcc::training::CheckTrainConfig(config, world_size);
  if (!status.ok()) {
    std::fprintf(stderr, "train_gpt: %s\n", status.ToString().c_str());
    return 2;
  }
  mcc::training::ConfigureThreads(config);
  auto exit_conditions = mcc::training::ExitConditions::Create(
      *mcc::training::ExitOptionsFromConfig(config), absl::Now(), nullptr);
  if (exit_conditions.ok()) {
    status = mcc::training::Run(config, exit_conditions->get());
  } else {
    status = exit_conditions.status();
  }
  if (!status.ok()) {
    LOG(ERROR) << "training failed: " << status;
    return 1;
  }
  return 0;
}
