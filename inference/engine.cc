#include "inference/engine.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"

namespace mcc {
namespace inference {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kTimeout:
      return "timeout";
    case FinishReason::kNone:
      break;
  }
  return "none";
}

Engine::Engine(EngineOptions options, StepExecutor* executor,
               PagedKvCache* cache, std::unique_ptr<data::Tokenizer> tokenizer)
    : options_(options),
      executor_(executor),
      cache_(cache),
      tokenizer_(std::move(tokenizer)),
      scheduler_(options.scheduler, cache) {}

absl::StatusOr<uint64_t> Engine::Submit(GenerationRequest request,
                                        GenerationCallback callback) {
  auto refuse = [&](std::string message) {
    metrics_.RecordRejected();
    return absl::InvalidArgumentError(std::move(message));
  };
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  if (n == 0) return refuse("the prompt holds no tokens");
  if (tokenizer_ == nullptr && !request.stop.empty()) {
    return refuse("stop strings need a tokenizer (this engine has none)");
  }
  for (int64_t t : request.prompt) {
    if (t < 0 || t >= options_.model_vocab) {
      return refuse(absl::StrCat("prompt token ", t,
                                 " is outside the vocabulary of ",
                                 options_.model_vocab));
    }
  }
  if (options_.max_prompt_tokens > 0 && n > options_.max_prompt_tokens) {
    return refuse(absl::StrCat(
        "the prompt's ", n, " tokens exceed the server's limit of ",
        options_.max_prompt_tokens, " (--max-prompt-tokens)"));
  }
  if (request.max_new_tokens < 0) {
    return refuse(absl::StrCat("max new tokens must be >= 0, got ",
                               request.max_new_tokens));
  }
  // Compared without adding: n + max_new_tokens overflows for a client's
  // max_new_tokens near INT64_MAX.
  if (n > options_.max_positions ||
      request.max_new_tokens > options_.max_positions - n) {
    return refuse(absl::StrCat("the prompt's ", n, " tokens plus ",
                               request.max_new_tokens,
                               " to generate exceed the model's context of ",
                               options_.max_positions, " positions"));
  }
  const int64_t blocks = cache_->BlocksFor(n + request.max_new_tokens);
  if (blocks > cache_->num_blocks()) {
    return refuse(absl::StrCat(
        "the request needs ", blocks, " KV-cache blocks; the pool holds only ",
        cache_->num_blocks(), " (raise --kv-cache-bytes)"));
  }
  const SamplingParams& p = request.sampling;
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    return refuse(
        absl::StrCat("temperature must be >= 0, got ", p.temperature));
  }
  if (p.top_k < 0) {
    return refuse(absl::StrCat("top_k must be >= 0, got ", p.top_k));
  }
  if (!(p.top_p >= 0 && p.top_p <= 1)) {
    return refuse(absl::StrCat("top_p must be in [0, 1], got ", p.top_p));
  }
  absl::MutexLock lock(&mu_);
  if (stopped_) {
    return absl::UnavailableError(
        "the engine has stopped (see the server's log)");
  }
  const int64_t queue_limit =
      options_.max_queued_requests > 0
          ? options_.scheduler.max_batch_size + options_.max_queued_requests
          : 0;
  if (queue_limit > 0 && unfinished_.load() >= queue_limit) {
    metrics_.RecordRejected();
    return absl::ResourceExhaustedError(
        absl::StrCat("the server is busy: ", unfinished_.load(),
                     " requests are running or queued (--max-queued-requests ",
                     options_.max_queued_requests, "); retry later"));
  }
  ++unfinished_;
  metrics_.RecordRequest(n);
  const uint64_t id = next_id_++;
  auto s =
      std::make_unique<Sequence>(id, std::move(request), std::move(callback));
  s->submitted = absl::Now();
  pending_.push_back(std::move(s));
  return id;
}

void Engine::Cancel(uint64_t id) {
  absl::MutexLock lock(&mu_);
  cancels_.push_back(id);
}

void Engine::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
}

void Engine::Drain() {
  std::vector<std::unique_ptr<Sequence>> pending;
  std::vector<uint64_t> cancels;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(pending_);
    cancels.swap(cancels_);
  }
  for (auto& s : pending) scheduler_.Add(std::move(s));
  for (uint64_t id : cancels) {
    if (Sequence* s = scheduler_.Find(id)) Finish(s, FinishReason::kCancelled);
  }
}

void Engine::ExpireDeadlines() {
  const absl::Time now = absl::Now();
  for (Sequence* s : scheduler_.All()) {
    if (now >= s->request.deadline) Finish(s, FinishReason::kTimeout);
  }
}

void Engine::Finish(Sequence* s, FinishReason reason) {
  GenerationEvent event;
  event.finished = true;
  event.finish_reason = reason;
  event.text_delta = s->text.TakeReady(/*final=*/true);
  event.tokens.assign(s->tokens.begin() + s->prompt_len(), s->tokens.end());
  event.logprobs = s->logprobs;
  event.prompt_logprobs = s->prompt_logprobs;
  event.text = s->text.text();
  s->callback(event);
  metrics_.RecordFinished();
  scheduler_.Remove(s);
  --unfinished_;
}

int64_t Engine::SampleLimit() const {
  // The tokenizer's vocabulary (the padding never wins), or without one
  // every id of the model.
  return tokenizer_ != nullptr ? tokenizer_->vocab_size()
                               : options_.model_vocab;
}

void Engine::Sampled(Sequence* s, const float* logits) {
  const int64_t limit = SampleLimit();
  const int64_t token =
      SampleToken(logits, limit, s->request.sampling, &s->rng);
  const absl::Time now = absl::Now();
  if (s->generated() == 0) {
    metrics_.RecordTimeToFirstToken(absl::ToDoubleSeconds(now - s->submitted));
  } else {
    metrics_.RecordInterTokenLatency(
        absl::ToDoubleSeconds(now - s->last_token));
  }
  s->last_token = now;
  if (s->request.stop_at_eod && tokenizer_ != nullptr &&
      token == tokenizer_->eod()) {
    Finish(s, FinishReason::kStop);
    return;
  }
  metrics_.RecordOutputToken();
  s->tokens.push_back(token);
  s->logprobs.push_back(TokenLogProb(logits, limit, token));
  bool stopped = false;
  if (tokenizer_ != nullptr) {
    auto text = tokenizer_->Decode(absl::MakeConstSpan(
        s->tokens.data() + s->prompt_len(), s->generated()));
    stopped = s->text.Update(text.ok() ? *text : std::string());
  }
  GenerationEvent event;
  event.has_token = true;
  event.token = token;
  event.logprob = s->logprobs.back();
  event.text_delta = s->text.TakeReady(/*final=*/false);
  s->callback(event);
  if (stopped) {
    Finish(s, FinishReason::kStop);
  } else if (s->generated() >= s->request.max_new_tokens) {
    Finish(s, FinishReason::kLength);
  }
}

absl::StatusOr<bool> Engine::Step() {
  Drain();
  ExpireDeadlines();
  StepPlan plan = scheduler_.Plan();
  metrics_.SetQueue(scheduler_.waiting(), scheduler_.running(),
                    cache_->free_blocks());
  if (plan.empty()) return false;
  const absl::Time start = absl::Now();
  auto logits = executor_->Execute(plan.rows);
  if (!logits.ok()) return logits.status();
  const absl::Time computed = absl::Now();
  metrics_.RecordStep(static_cast<int64_t>(plan.slices.size()),
                      plan.rows.rows(),
                      absl::ToDoubleSeconds(computed - start));
  const int64_t vocab = options_.model_vocab;
  size_t next_logit = 0, row = 0;
  for (const ScheduledSlice& slice : plan.slices) {
    Sequence* s = slice.sequence;
    const int64_t last = static_cast<int64_t>(s->tokens.size()) - 1;
    const float* sample_logits = nullptr;
    for (int64_t p = slice.begin; p < slice.begin + slice.count; ++p, ++row) {
      if (next_logit < plan.rows.logit_rows.size() &&
          plan.rows.logit_rows[next_logit] == static_cast<int32_t>(row)) {
        const float* lg = logits->data() + next_logit * vocab;
        ++next_logit;
        if (p == last && s->generated() < s->request.max_new_tokens) {
          sample_logits = lg;
        } else {
          s->prompt_logprobs.push_back(
              TokenLogProb(lg, SampleLimit(), s->tokens[p + 1]));
        }
      }
    }
    s->computed = slice.begin + slice.count;
    if (sample_logits != nullptr) {
      Sampled(s, sample_logits);
    } else if (!s->prefilling() && s->request.max_new_tokens == 0) {
      Finish(s, FinishReason::kLength);
    }
  }
  metrics_.SetQueue(scheduler_.waiting(), scheduler_.running(),
                    cache_->free_blocks());
  metrics_.RecordStepAfterModel(absl::ToDoubleSeconds(absl::Now() - computed));
  return true;
}

void Engine::FailAll() {
  Drain();
  for (Sequence* s : scheduler_.All()) Finish(s, FinishReason::kCancelled);
}

bool Engine::HasWork() const {
  return stop_ || !pending_.empty() || !cancels_.empty();
}

absl::Status Engine::Run() {
  absl::Status status = RunSteps();
  {
    // Later submissions are refused; those before get their last event.
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  FailAll();
  // After a failed step the other ranks may be gone: the launcher stops them.
  if (!status.ok()) return status;
  return executor_->Shutdown();
}

absl::Status Engine::RunSteps() {
  absl::Time last_work = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
    }
    auto worked = Step();
    if (!worked.ok()) {
      LOG(ERROR) << "inference engine: a step failed: " << worked.status();
      return worked.status();
    }
    if (*worked) {
      last_work = absl::Now();
      continue;
    }
    if (absl::Now() - last_work > options_.idle_interval) {
      if (absl::Status s = executor_->Idle(); !s.ok()) {
        LOG(ERROR) << "inference engine: " << s;
        return s;
      }
      last_work = absl::Now();
    }
    absl::MutexLock lock(&mu_);
    if (scheduler_.running() == 0 && scheduler_.waiting() == 0) {
      mu_.AwaitWithTimeout(absl::Condition(this, &Engine::HasWork),
                           absl::Milliseconds(100));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerationEvent> GenerateOne(Engine* engine,
                                            GenerationRequest request,
                                            absl::Time* first_step_done) {
  GenerationEvent result;
  bool done = false;
  auto id =
      engine->Submit(std::move(request), [&](const GenerationEvent& event) {
        if (!event.finished) return;
        result = event;
        done = true;
      });
  if (!id.ok()) return id.status();
  for (int step = 0; !done; ++step) {
    auto worked = engine->Step();
    if (!worked.ok()) return worked.status();
    if (step == 0 && first_step_done != nullptr) *first_step_done = absl::Now();
    if (!*worked && !done) {
      return absl::InternalError(
          "the engine had nothing to run before the request finished");
    }
  }
  return result;
}

}  // namespace inference
}  // namespace mcc
