#include "tools/flags/serve_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on.");
ABSL_FLAG(int32_t, port, 8000, "Port to listen on (0: any free port).");
ABSL_FLAG(std::string, port_file, "",
          "Writes the port bound here once listening (for --port 0).");
ABSL_FLAG(int32_t, max_batch_size, 32,
          "Sequences in one decoding step at most (continuous batching).");
ABSL_FLAG(int64_t, prefill_chunk_size, 64,
          "Prompt tokens of one sequence per step (long prompts run in "
          "chunks between decoding steps).");
ABSL_FLAG(int64_t, max_tokens_per_step, 0,
          "Token budget of one step (0: --prefill-chunk-size + "
          "--max-batch-size).");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{256} << 20,
          "Bytes of the paged KV cache per rank; requests wait when it is "
          "full.");
ABSL_FLAG(double, kv_cache_memory_fraction, 0,
          "On a CUDA device, when positive: the KV cache takes this fraction "
          "of the device memory left free after the weights, instead of "
          "--kv-cache-bytes.");
ABSL_FLAG(bool, batch_invariant, false,
          "With --device cuda: every GEMM one row at a time, so a request's "
          "tokens are bit-identical batched or alone (slower: the weights "
          "are read once per row). The CPU engine is always batch-invariant; "
          "on a GPU without it a request's log-probabilities may change in "
          "the last bits with the batch it runs in.");
ABSL_FLAG(bool, random_weights, false,
          "Test-only: serve no checkpoint but the model of the model flags "
          "(--num-layers, --hidden-size, ..., --vocab-size) with random "
          "weights made on the device (--device cuda; tools/gpu's serving "
          "check, for shapes too big to carry as a checkpoint).");
ABSL_FLAG(int64_t, kv_block_size, 16, "Positions per KV-cache block.");
ABSL_FLAG(std::string, batching, "continuous",
          "continuous (requests join every step) or static (a batch forms, "
          "runs to completion, then the next; for comparison).");
ABSL_FLAG(int64_t, max_body_bytes, 1 << 20,
          "Request bodies larger than this are refused (413) unread.");
ABSL_FLAG(int32_t, http_threads, 128,
          "Requests handled at once (whole requests: a slow client's bytes "
          "are received by one reader thread first); at least "
          "--max-batch-size + --max-queued-requests + 8 are started.");
ABSL_FLAG(std::string, api_key, "",
          "Clients must send 'Authorization: Bearer KEY' on every route but "
          "/health (401 otherwise). Default: the environment variable "
          "MCC_API_KEY (which, unlike a flag, other users cannot read from "
          "the process list); empty: no key.");
ABSL_FLAG(int64_t, max_prompt_tokens, 0,
          "Prompt tokens one request may hold; more is a 400 (0: the model's "
          "context).");
ABSL_FLAG(int64_t, max_queued_requests, 64,
          "Requests that may wait beyond the --max-batch-size running ones; "
          "more get 429 with Retry-After (0: no bound).");
ABSL_FLAG(double, request_timeout, 600,
          "Seconds a request may take; then its generation is stopped and "
          "its KV blocks freed, and the client gets 504 (or finish_reason "
          "\"timeout\" when streamed). 0: no limit.");
ABSL_FLAG(double, request_read_timeout, 10,
          "Seconds a client has to send a request's headers and body (408 "
          "and closed after); idle kept-alive connections close after 5 s "
          "or this, whichever is less.");
ABSL_FLAG(int32_t, max_connections, 1024,
          "Open connections at once; more are answered 503 and closed.");
ABSL_FLAG(int64_t, spin_wait_us, 200,
          "Microseconds the kernel pool's idle threads poll for the next "
          "loop before sleeping (0: sleep at once). Waking a sleeping thread "
          "costs about as much as one loop of a decoding step on a VM; "
          "polling burns a core, so lower it when the server shares its "
          "cores.");
ABSL_FLAG(std::string, tokenizer_config, "",
          "tokenizer_config.json (or its directory) whose chat_template "
          "serves POST /v1/chat/completions (bos_token and eos_token from "
          "the same file); without it that route answers 404.");
