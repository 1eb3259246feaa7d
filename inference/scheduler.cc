#include "inference/scheduler.h"

#include <algorithm>

#include "core/ops/sliding_window.h"

namespace mcc {
namespace inference {

Scheduler::Scheduler(SchedulerOptions options, PagedKvCache* cache)
    : options_(options), cache_(cache) {}

void Scheduler::Add(std::unique_ptr<Sequence> sequence) {
  waiting_.push_back(std::move(sequence));
}

bool Scheduler::Admit(Sequence* sequence) {
  const int64_t length =
      sequence->prompt_len() + sequence->request.max_new_tokens;
  return cache_->Allocate(cache_->BlocksFor(length), &sequence->table);
}

StepPlan Scheduler::Plan() {
  StepPlan plan;
  if (options_.window_left >= 0 && !options_.recompute_prefix) {
    // The next query of a running sequence is at `computed`; no later one
    // reads before that query's first key.
    for (const auto& s : running_) {
      cache_->FreeBefore(
          ops::SlidingWindowFirstKey(s->computed, options_.window_left),
          &s->table);
    }
  }
  // Waiting requests join while the batch has room and the pool has blocks
  // for their whole length (static batching: only into an empty batch).
  const bool may_admit = !options_.static_batching || running_.empty();
  while (may_admit && !waiting_.empty() &&
         static_cast<int>(running_.size()) < options_.max_batch_size) {
    if (!Admit(waiting_.front().get())) break;  // Waits, in order.
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  int64_t budget = options_.token_budget();
  // Decoding sequences first (one new token each), then prompt chunks in
  // admission order while the token budget lasts.
  for (const auto& s : running_) {
    if (s->prefilling() || budget <= 0) continue;
    const int64_t begin = options_.recompute_prefix ? 0 : s->computed;
    plan.slices.push_back({s.get(), begin, s->computed + 1 - begin});
    budget -= 1;
  }
  for (const auto& s : running_) {
    if (s->prefilling() && budget > 0) {
      const int64_t count = std::min(
          {s->prompt_len() - s->computed, options_.prefill_chunk_size, budget});
      plan.slices.push_back({s.get(), s->computed, count});
      budget -= count;
    }
  }
  // The rows every rank runs.
  StepRows& rows = plan.rows;
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const ScheduledSlice& slice = plan.slices[i];
    const Sequence& s = *slice.sequence;
    rows.tables.push_back(s.table);
    const int64_t last = static_cast<int64_t>(s.tokens.size()) - 1;
    for (int64_t p = slice.begin; p < slice.begin + slice.count; ++p) {
      const bool sample = p == last && s.generated() < s.request.max_new_tokens;
      // Once per prompt position (not again when the prefix is recomputed).
      const bool prompt_logprob = s.request.prompt_logprobs &&
                                  p + 1 < s.prompt_len() && p >= s.computed;
      if (sample || prompt_logprob) {
        rows.logit_rows.push_back(static_cast<int32_t>(rows.tokens.size()));
      }
      rows.tokens.push_back(s.tokens[p]);
      rows.positions.push_back(p);
      rows.table.push_back(static_cast<int32_t>(i));
    }
  }
  return plan;
}

void Scheduler::Remove(Sequence* sequence) {
  cache_->Free(&sequence->table);
  auto same = [&](const std::unique_ptr<Sequence>& s) {
    return s.get() == sequence;
  };
  auto r = std::find_if(running_.begin(), running_.end(), same);
  if (r != running_.end()) {
    running_.erase(r);
    return;
  }
  auto w = std::find_if(waiting_.begin(), waiting_.end(), same);
  if (w != waiting_.end()) waiting_.erase(w);
}

std::vector<Sequence*> Scheduler::All() const {
  std::vector<Sequence*> all;
  for (const auto& s : running_) all.push_back(s.get());
  for (const auto& s : waiting_) all.push_back(s.get());
  return all;
}

Sequence* Scheduler::Find(uint64_t id) const {
  for (const auto& s : running_) {
    if (s->id == id) return s.get();
  }
  for (const auto& s : waiting_) {
    if (s->id == id) return s.get();
  }
  return nullptr;
}

}  // namespace inference
}  // namespace mcc
