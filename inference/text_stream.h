#ifndef INFERENCE_TEXT_STREAM_H_
#define INFERENCE_TEXT_STREAM_H_

// The text of a growing generation, for streaming and stop strings: what may
// be sent so far (never half a UTF-8 character, never text that could still
// turn out to begin a stop string) and whether a stop string has appeared.

#include <string>
#include <vector>

namespace mcc {
namespace inference {

// Not thread-safe (one per request, on the engine thread).
class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop_strings);

  // Sets the whole generated text so far (the decoded tokens). Returns true
  // when it contains a stop string; the text is then cut before the first
  // one, and the stream is finished.
  bool Update(const std::string& text);
  // Text not sent before that is safe to send now (all of the rest once
  // `final` is set: the generation ended).
  std::string TakeReady(bool final);
  // The text so far, cut before a stop string if one appeared.
  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string text_;
  size_t sent_ = 0;
  bool stopped_ = false;
};

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_TEXT_STREAM_H_
