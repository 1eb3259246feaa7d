#ifndef TOOLS_SERVE_SERVER_H_
#define TOOLS_SERVE_SERVER_H_

// The whole of tools/serve as one call: loads the checkpoint into this
// rank's part of the layout (inference/serving_model.h); rank 0 serves HTTP
// (Megatron's PUT /api, OpenAI-style POST /v1/completions, GET /health,
// GET /metrics) with continuous batching and plans every step, and the other
// ranks follow its steps until it shuts down. Returns when the server stops
// (an error: the engine or a rank failed, or the port could not be bound).

#include "absl/status/status.h"
#include "inference/serve_config.pb.h"

namespace mcc {
namespace serve {

// Check first with inference::CheckServeConfig. Every rank calls it.
absl::Status RunServer(const inference::ServeConfig& config);

}  // namespace serve
}  // namespace mcc

#endif  // TOOLS_SERVE_SERVER_H_
