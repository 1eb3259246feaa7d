#include "inference/text_stream.h"

#include <algorithm>

namespace mcc {
namespace inference {
namespace {

// Bytes at the end of s that start a UTF-8 character not yet complete.
size_t IncompleteUtf8Tail(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // Continuation byte.
    size_t need = 1;
    if ((c & 0xE0) == 0xC0)
      need = 2;
    else if ((c & 0xF0) == 0xE0)
      need = 3;
    else if ((c & 0xF8) == 0xF0)
      need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

TextStream::TextStream(std::vector<std::string> stop_strings) {
  for (std::string& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

bool TextStream::Update(const std::string& text) {
  if (stopped_) return true;
  text_ = text;
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) {
    first = std::min(first, text_.find(stop));
  }
  if (first != std::string::npos) {
    text_.resize(first);
    stopped_ = true;
  }
  return stopped_;
}

std::string TextStream::TakeReady(bool final) {
  size_t end = text_.size();
  if (!final && !stopped_) {
    end -= IncompleteUtf8Tail(text_);
    // Hold back the longest tail that could begin a stop string.
    size_t hold = 0;
    for (const std::string& stop : stops_) {
      for (size_t len = std::min(stop.size() - 1, end); len > hold; --len) {
        if (text_.compare(end - len, len, stop, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
    end -= hold;
  }
  if (end <= sent_) return "";
  std::string ready = text_.substr(sent_, end - sent_);
  sent_ = end;
  return ready;
}

}  // namespace inference
}  // namespace mcc
