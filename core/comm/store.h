#ifndef CORE_COMM_STORE_H_
#define CORE_COMM_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace mcc {
namespace comm {

// A key-value store shared by the ranks of a job, used for rendezvous (as
// torch.distributed's Store). Every call is bounded by a timeout: a call
// without one uses the store's default timeout.
class Store {
 public:
  virtual ~Store() = default;

  virtual absl::Duration default_timeout() const = 0;

  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // Waits until key exists, then returns its value.
  virtual absl::StatusOr<std::string> Get(absl::string_view key,
                                          absl::Duration timeout) = 0;
  // Waits until every key exists.
  virtual absl::Status Wait(absl::Span<const std::string> keys,
                            absl::Duration timeout) = 0;
  // Adds delta to the integer stored at key (0 when absent) and returns the
  // new value.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;
  // Whether every key exists, without waiting.
  virtual absl::StatusOr<bool> Check(absl::Span<const std::string> keys) = 0;
  virtual absl::Status Delete(absl::string_view key) = 0;

  // Ranks whose processes were lost (connection to the store dropped without
  // a clean goodbye). Empty for stores that do not track liveness.
  virtual absl::StatusOr<std::vector<int>> LostRanks() {
    return std::vector<int>();
  }

  absl::StatusOr<std::string> Get(absl::string_view key) {
    return Get(key, default_timeout());
  }
  absl::Status Wait(absl::Span<const std::string> keys) {
    return Wait(keys, default_timeout());
  }
};

// Prepends a prefix ("<prefix>/") to every key of another store: one
// namespace per process group.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}

  absl::Duration default_timeout() const override {
    return base_->default_timeout();
  }
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return base_->Set(Key(key), value);
  }
  using Store::Get;
  using Store::Wait;
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override {
    return base_->Get(Key(key), timeout);
  }
  absl::Status Wait(absl::Span<const std::string> keys,
                    absl::Duration timeout) override {
    return base_->Wait(Keys(keys), timeout);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    return base_->Add(Key(key), delta);
  }
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override {
    return base_->Check(Keys(keys));
  }
  absl::Status Delete(absl::string_view key) override {
    return base_->Delete(Key(key));
  }
  absl::StatusOr<std::vector<int>> LostRanks() override {
    return base_->LostRanks();
  }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string Key(absl::string_view key) const {
    return prefix_ + std::string(key);
  }
  std::vector<std::string> Keys(absl::Span<const std::string> keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const std::string& k : keys) out.push_back(Key(k));
    return out;
  }

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_STORE_H_
