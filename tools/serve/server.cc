#include "tools/serve/server.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "data/tokenizer_config.h"
#include "glog/logging.h"
#include "inference/distributed_step.h"
#include "inference/engine.h"
#include "inference/serving_model.h"
#include "tools/serve/http_frontend.h"

namespace mcc {
namespace serve {
namespace {

// Rank 0: the engine on its own thread, the HTTP front end on this one.
absl::Status ServeHttp(const inference::ServeConfig& config,
                       inference::ServingModel& loaded) {
  std::unique_ptr<inference::StepExecutor> executor =
      inference::MakeStepExecutor(loaded.runner.get(), loaded.layout);
  ThreadPool::Global().SetSpinMicros(config.spin_wait_us());
  const inference::EngineOptions options =
      inference::EngineOptionsFor(config, loaded.config());
  inference::Engine engine(options, executor.get(), &loaded.runner->cache(),
                           loaded.tokenizer->Clone());
  FrontendOptions frontend_options;
  frontend_options.max_body_bytes =
      static_cast<size_t>(config.max_body_bytes());
  // A generation holds its handler's thread; with more threads than the
  // engine takes requests, /health and the 429s always find one.
  frontend_options.http_threads = config.http_threads();
  if (options.max_queued_requests > 0) {
    frontend_options.http_threads = std::max<int64_t>(
        frontend_options.http_threads,
        options.scheduler.max_batch_size + options.max_queued_requests + 8);
  }
  frontend_options.api_key = config.api_key();
  frontend_options.request_timeout = absl::Seconds(config.request_timeout());
  frontend_options.read_timeout = absl::Seconds(config.request_read_timeout());
  frontend_options.idle_timeout =
      std::min(absl::Seconds(5), frontend_options.read_timeout);
  frontend_options.max_connections = config.max_connections();
  if (!config.tokenizer_config().empty()) {
    auto chat = data::ReadTokenizerConfig(config.tokenizer_config());
    if (!chat.ok()) {
      (void)executor->Shutdown();
      return absl::InvalidArgumentError(
          absl::StrCat("--tokenizer-config: ", chat.status().message()));
    }
    frontend_options.chat = *chat;
  }
  const std::string host = config.host();
  if (frontend_options.api_key.empty() && host != "127.0.0.1" &&
      host != "localhost" && host != "::1") {
    LOG(WARNING) << "serve: --host " << host
                 << " accepts other machines' connections and no --api-key "
                    "(or MCC_API_KEY) is set: anyone who reaches the port "
                    "can use it";
  }
  HttpFrontend frontend(&engine, loaded.tokenizer->Clone(), frontend_options);
  auto port = frontend.Bind(config.host(), config.port());
  if (!port.ok()) {
    (void)executor->Shutdown();
    return port.status();
  }
  absl::Status engine_status;
  std::thread engine_thread([&] {
    engine_status = engine.Run();
    if (!engine_status.ok()) {
      frontend.SetUnhealthy(std::string(engine_status.message()));
      frontend.Stop();
    }
  });
  LOG(INFO) << "serve: listening on http://" << config.host() << ":" << *port;
  if (const std::string file = config.port_file(); !file.empty()) {
    std::ofstream(file + ".tmp") << *port << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
  }
  const absl::Status listened = frontend.Listen();
  engine.Stop();
  engine_thread.join();
  if (!listened.ok()) return listened;
  if (!engine_status.ok()) {
    return absl::Status(
        engine_status.code(),
        absl::StrCat("the engine stopped: ", engine_status.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunServer(const inference::ServeConfig& config) {
  MCC_ASSIGN_OR_RETURN(inference::ServingModel loaded,
                       inference::LoadServingModel(config));
  if (loaded.job->rank == 0) return ServeHttp(config, loaded);
  // Follow rank 0's steps until it shuts down.
  absl::Status s = inference::FollowSteps(loaded.runner.get(), loaded.layout);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("rank ", loaded.job->rank,
                                               " stops: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace serve
}  // namespace mcc
