#ifndef TOOLS_SERVE_CHAT_FRONTEND_H_
#define TOOLS_SERVE_CHAT_FRONTEND_H_

// The chat routes of tools/serve: POST /v1/chat/completions (the model's
// chat template applied to the messages, the answer ended at the template's
// end-of-turn text, streamed as server-sent events on request) and
// GET /v1/models. HttpFrontend owns one and registers its routes.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "data/chat_template.h"
#include "data/tokenizer_config.h"
#include "httplib.h"
#include "inference/engine.h"

namespace mcc {
namespace serve {

class ChatFrontend {
 public:
  // What the frontend lends: its engine, its (locked) tokenizer and its
  // per-request settings.
  struct Hooks {
    inference::Engine* engine = nullptr;
    std::function<absl::StatusOr<std::vector<int64_t>>(const std::string&)>
        encode;
    std::function<absl::Time()> deadline;
    std::function<uint64_t()> next_seed;
    std::string model_name;
    absl::Duration request_timeout = absl::ZeroDuration();
  };

  // `chat` empty: /v1/chat/completions answers 404 saying the server has no
  // chat template. An unsupported template is an error naming it.
  static absl::StatusOr<std::unique_ptr<ChatFrontend>> Create(
      Hooks hooks, std::optional<data::ChatTemplateConfig> chat);

  void Register(httplib::Server* server);

  // The text the template writes after an assistant message (its
  // end-of-turn, e.g. "<|eot_id|>", "<|im_end|>"), found by rendering a
  // probe conversation; empty when the template will not render one. With
  // eos_token, the answer's stop strings.
  const std::vector<std::string>& end_of_turn() const { return end_of_turn_; }

 private:
  ChatFrontend() = default;
  void HandleChat(const httplib::Request& req, httplib::Response& res);
  void HandleModels(const httplib::Request& req, httplib::Response& res);

  Hooks hooks_;
  std::optional<data::ChatTemplateConfig> config_;
  std::optional<data::ChatTemplate> template_;
  std::vector<std::string> end_of_turn_;
  std::atomic<uint64_t> next_id_{1};
};

// The text after an assistant message's content in the template's
// rendering, whitespace-trimmed ("" when it renders none).
std::string EndOfTurnText(const data::ChatTemplate& chat_template,
                          const data::ChatTemplateConfig& config);

}  // namespace serve
}  // namespace mcc

#endif  // TOOLS_SERVE_CHAT_FRONTEND_H_
