#ifndef INFERENCE_SERVING_MODEL_H_
#define INFERENCE_SERVING_MODEL_H_

// A checkpoint loaded for serving: this rank's part of the model (any TP x
// PP layout loads any checkpoint, resharded on load) as the engine's
// weights, the rank's paged KV cache, and the tokenizer. tools/serve puts
// an HTTP front end on it; any program can put its own.
//
//   ServingModel model = *LoadServingModel(config);       // collective
//   if (model.job->rank != 0) return FollowSteps(model.runner.get(),
//                                                model.layout);
//   auto executor = MakeStepExecutor(model.runner.get(), model.layout);
//   Engine engine(EngineOptionsFor(config, model.config()), executor.get(),
//                 &model.runner->cache(), model.tokenizer->Clone());

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/tokenizer.h"
#include "inference/distributed_step.h"
#include "inference/engine.h"
#include "inference/model_runner.h"
#include "inference/serve_config.pb.h"
#include "training/device_choice.h"
#include "training/job.h"

namespace mcc {
namespace inference {

struct ServingModel {
  // The world and groups (the training model itself is freed once the
  // engine holds its weights).
  std::unique_ptr<training::Job> job;
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<ModelRunner> runner;
  StageLayout layout;

  const gpt::GPTConfig& config() const { return runner->weights().config; }
};

// The settings against each other, before anything is loaded; errors name
// the setting as its flag.
absl::Status CheckServeConfig(const ServeConfig& config);

// The device the engine runs on by config.run().device() (cpu, cuda, auto;
// training/device_choice.h): auto keeps the CPU for what the device engine
// does not run yet (a TP or PP layout), which --device cuda refuses.
absl::StatusOr<training::DeviceChoice> ServingDevice(const ServeConfig& config);

// Loads config.run().load() into this rank's part of the layout: the
// world must be exactly TP x PP processes (no data parallelism). Every
// rank's KV cache holds as many blocks as the smallest (rank 0 plans with
// that count). Collective over the launcher's world.
absl::StatusOr<ServingModel> LoadServingModel(const ServeConfig& config);

// The engine's scheduler and limits for `model`.
EngineOptions EngineOptionsFor(const ServeConfig& config,
                               const gpt::GPTConfig& model);

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_SERVING_MODEL_H_
