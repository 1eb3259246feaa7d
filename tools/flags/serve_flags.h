#ifndef TOOLS_FLAGS_SERVE_FLAGS_H_
#define TOOLS_FLAGS_SERVE_FLAGS_H_

// The flags of serve alone (engine, KV cache, HTTP front end); a binary
// reads them only through its ServeConfig (inference/serve_config.proto,
// the same names and defaults).

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(int32_t, port);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(int32_t, max_batch_size);
ABSL_DECLARE_FLAG(int64_t, prefill_chunk_size);
ABSL_DECLARE_FLAG(int64_t, max_tokens_per_step);
ABSL_DECLARE_FLAG(int64_t, kv_cache_bytes);
ABSL_DECLARE_FLAG(double, kv_cache_memory_fraction);
ABSL_DECLARE_FLAG(bool, batch_invariant);
ABSL_DECLARE_FLAG(bool, random_weights);
ABSL_DECLARE_FLAG(int64_t, kv_block_size);
ABSL_DECLARE_FLAG(std::string, batching);
ABSL_DECLARE_FLAG(int64_t, max_body_bytes);
ABSL_DECLARE_FLAG(int32_t, http_threads);
ABSL_DECLARE_FLAG(std::string, api_key);
ABSL_DECLARE_FLAG(int64_t, max_prompt_tokens);
ABSL_DECLARE_FLAG(int64_t, max_queued_requests);
ABSL_DECLARE_FLAG(double, request_timeout);
ABSL_DECLARE_FLAG(double, request_read_timeout);
ABSL_DECLARE_FLAG(int32_t, max_connections);
ABSL_DECLARE_FLAG(int64_t, spin_wait_us);
ABSL_DECLARE_FLAG(std::string, tokenizer_config);

#endif  // TOOLS_FLAGS_SERVE_FLAGS_H_
