// Fuzzes the inference engine's request validation and bookkeeping with the
// values a client controls: each input is up to three requests (any
// max_new_tokens, prompt ids, sampling parameters, stop strings, deadline)
// and when to cancel them. The engine runs a FakeStepExecutor, which refuses
// a step whose positions the KV blocks do not cover, as the model runner
// does. Invariants: Submit refuses with a message or accepts; a step never
// fails; every accepted request ends exactly once, within the steps its
// length allows; then every KV block is back and nothing is unfinished.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "data/tokenizer.h"
#include "glog/logging.h"
#include "inference/engine.h"
#include "inference/fake_step_executor.h"
#include "inference/paged_kv_cache.h"

namespace {

using mcc::inference::Engine;
using mcc::inference::GenerationEvent;
using mcc::inference::GenerationRequest;

constexpr int64_t kBlocks = 24;
constexpr int64_t kBlockSize = 4;
constexpr int64_t kContext = 64;
constexpr int64_t kVocab = 264;

// Reads fixed-size values off the input; zeros past its end.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T Take() {
    T v{};
    const size_t n = std::min(sizeof(T), size_ - pos_);
    std::memcpy(&v, data_ + pos_, n);
    pos_ += n;
    return v;
  }
  bool empty() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

struct World {
  World() {
    mcc::inference::KvCacheShape shape;
    shape.num_layers = 1;
    shape.kv_heads = 1;
    shape.head_dim = 1;
    shape.block_size = kBlockSize;
    cache = std::make_unique<mcc::inference::PagedKvCache>(
        mcc::inference::PagedKvCache::WithBlocks(shape, kBlocks));
    executor = std::make_unique<mcc::inference::FakeStepExecutor>(
        kVocab, kBlockSize, /*favoured=*/kVocab);
    mcc::inference::EngineOptions options;
    options.scheduler.max_batch_size = 2;
    options.scheduler.prefill_chunk_size = 8;
    options.max_positions = kContext;
    options.model_vocab = kVocab;
    options.max_prompt_tokens = 48;
    options.max_queued_requests = 1;
    engine = std::make_unique<Engine>(options, executor.get(), cache.get(),
                                      mcc::data::MakeByteTokenizer());
  }
  std::unique_ptr<mcc::inference::PagedKvCache> cache;
  std::unique_ptr<mcc::inference::FakeStepExecutor> executor;
  std::unique_ptr<Engine> engine;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* world = new World;
  Engine& engine = *world->engine;
  Reader in(data, size);
  struct Submitted {
    uint64_t id;
    int cancel_at;  // The step after which it is cancelled (-1: never).
  };
  std::vector<Submitted> submitted;
  std::vector<int> finished_events;
  std::vector<bool> finished;
  const int requests = 1 + in.Take<uint8_t>() % 3;
  for (int i = 0; i < requests && !in.empty(); ++i) {
    GenerationRequest r;
    r.max_new_tokens = in.Take<int64_t>();
    const int len = in.Take<uint8_t>() % 72;
    for (int j = 0; j < len; ++j) r.prompt.push_back(in.Take<int16_t>());
    r.sampling.temperature = in.Take<double>();
    r.sampling.top_k = in.Take<int64_t>();
    r.sampling.top_p = in.Take<double>();
    r.sampling.seed = in.Take<uint64_t>();
    const uint8_t flags = in.Take<uint8_t>();
    r.stop_at_eod = flags & 1;
    r.prompt_logprobs = flags & 2;
    if (flags & 4) r.deadline = absl::Now() + absl::Milliseconds(flags >> 4);
    const int stops = in.Take<uint8_t>() % 3;
    for (int s = 0; s < stops; ++s) {
      std::string stop;
      const int n = in.Take<uint8_t>() % 4;
      for (int c = 0; c < n; ++c) stop.push_back(in.Take<char>());
      r.stop.push_back(stop);
    }
    const int cancel_at = static_cast<int8_t>(in.Take<uint8_t>());
    const size_t index = finished.size();
    finished.push_back(false);
    finished_events.push_back(0);
    auto id = engine.Submit(
        r, [&finished, &finished_events, index](const GenerationEvent& e) {
          if (e.finished) {
            finished[index] = true;
            ++finished_events[index];
          }
        });
    if (!id.ok()) {
      CHECK(!id.status().message().empty());
      CHECK(absl::IsInvalidArgument(id.status()) ||
            absl::IsResourceExhausted(id.status()))
          << id.status();
      finished[index] = true;
      finished_events[index] = 1;
      continue;
    }
    // Accepted: the whole length fits the context and the pool.
    CHECK_GE(r.max_new_tokens, 0);
    CHECK_LE(static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens,
             kContext);
    submitted.push_back({*id, cancel_at});
  }
  // Each request takes at most its prompt's chunks plus its tokens.
  for (int step = 0;; ++step) {
    bool all = true;
    for (bool f : finished) all = all && f;
    if (all) break;
    CHECK_LT(step, 1000) << "requests never finished";
    for (const Submitted& s : submitted) {
      if (s.cancel_at == step) engine.Cancel(s.id);
    }
    auto worked = engine.Step();
    CHECK(worked.ok()) << worked.status();
  }
  for (int n : finished_events) CHECK_EQ(n, 1);
  CHECK_EQ(engine.unfinished(), 0);
  CHECK_EQ(world->cache->free_blocks(), kBlocks);
  return 0;
}
