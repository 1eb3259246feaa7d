#include "data/json.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "core/json_text.h"

namespace mcc::data {
namespace {

class Parser {
 public:
  explicit Parser(absl::string_view t) : t_(t) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at byte offset ", pos_, ": ", what));
  }
  void SkipWs() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\t' ||
                                t_[pos_] == '\n' || t_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool AtEnd() {
    SkipWs();
    return pos_ >= t_.size();
  }
  bool Consume(char c) {
    SkipWs();
    if (pos_ < t_.size() && t_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  char Peek() {
    SkipWs();
    return pos_ < t_.size() ? t_[pos_] : '\0';
  }

  absl::Status Hex4(uint32_t* v) {
    if (pos_ + 4 > t_.size()) return Error("truncated \\u escape");
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = t_[pos_++];
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        --pos_;
        return Error("bad hex digit in \\u escape");
      }
      *v = *v * 16 + d;
    }
    return absl::OkStatus();
  }

  // Parses a string literal; out may be null to skip it.
  absl::Status String(std::string* out) {
    if (!Consume('"')) return Error("expected a string");
    while (true) {
      // Copy a run of plain bytes at once.
      size_t start = pos_;
      while (pos_ < t_.size() && t_[pos_] != '"' && t_[pos_] != '\\' &&
             static_cast<unsigned char>(t_[pos_]) >= 0x20) {
        ++pos_;
      }
      if (out != nullptr) out->append(t_.data() + start, pos_ - start);
      if (pos_ >= t_.size()) return Error("unterminated string");
      const char c = t_[pos_];
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c != '\\') return Error("control character in string");
      ++pos_;
      if (pos_ >= t_.size()) return Error("unterminated escape");
      const char e = t_[pos_++];
      char plain = 0;
      switch (e) {
        case '"':
          plain = '"';
          break;
        case '\\':
          plain = '\\';
          break;
        case '/':
          plain = '/';
          break;
        case 'b':
          plain = '\b';
          break;
        case 'f':
          plain = '\f';
          break;
        case 'n':
          plain = '\n';
          break;
        case 'r':
          plain = '\r';
          break;
        case 't':
          plain = '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          absl::Status s = Hex4(&cp);
          if (!s.ok()) return s;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo = 0;
            if (pos_ + 2 > t_.size() || t_[pos_] != '\\' ||
                t_[pos_ + 1] != 'u') {
              return Error("lone high surrogate (not valid UTF-8 text)");
            }
            pos_ += 2;
            s = Hex4(&lo);
            if (!s.ok()) return s;
            if (lo < 0xDC00 || lo > 0xDFFF) {
              return Error("high surrogate without a low surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Error("lone low surrogate (not valid UTF-8 text)");
          }
          if (out != nullptr) AppendUtf8(cp, out);
          continue;
        }
        default:
          --pos_;
          return Error(absl::StrCat("bad escape \\", std::string(1, e)));
      }
      if (out != nullptr) out->push_back(plain);
    }
  }

  absl::Status Number(int64_t* out) {
    SkipWs();
    const size_t start = pos_;
    if (pos_ < t_.size() && (t_[pos_] == '-' || t_[pos_] == '+')) ++pos_;
    while (pos_ < t_.size() &&
           ((t_[pos_] >= '0' && t_[pos_] <= '9') || t_[pos_] == '.' ||
            t_[pos_] == 'e' || t_[pos_] == 'E' || t_[pos_] == '-' ||
            t_[pos_] == '+')) {
      ++pos_;
    }
    if (pos_ == start) return Error("expected a value");
    if (out != nullptr) {
      int64_t v = 0;
      bool neg = t_[start] == '-';
      const size_t first = start + (neg ? 1 : 0);
      if (first == pos_) return Error("expected an integer");
      for (size_t i = first; i < pos_; ++i) {
        if (t_[i] < '0' || t_[i] > '9') {
          pos_ = i;
          return Error("expected an integer");
        }
        const int digit = t_[i] - '0';
        // Accumulate negatively: -2^63 is representable, 2^63 is not.
        if (v < (std::numeric_limits<int64_t>::min() + digit) / 10) {
          pos_ = start;
          return Error("integer out of the 64-bit range");
        }
        v = v * 10 - digit;
      }
      if (!neg && v == std::numeric_limits<int64_t>::min()) {
        pos_ = start;
        return Error("integer out of the 64-bit range");
      }
      *out = neg ? v : -v;
    }
    return absl::OkStatus();
  }

  absl::Status SkipValue(int depth) {
    if (depth > 256) return Error("nesting too deep");
    const char c = Peek();
    if (c == '"') return String(nullptr);
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      if (Consume(close)) return absl::OkStatus();
      while (true) {
        if (c == '{') {
          absl::Status s = String(nullptr);
          if (!s.ok()) return s;
          if (!Consume(':')) return Error("expected ':'");
        }
        absl::Status s = SkipValue(depth + 1);
        if (!s.ok()) return s;
        if (Consume(close)) return absl::OkStatus();
        if (!Consume(',')) return Error("expected ',' or a closing bracket");
      }
    }
    for (absl::string_view word : {"true", "false", "null"}) {
      if (t_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return absl::OkStatus();
      }
    }
    return Number(nullptr);
  }

  size_t pos() const { return pos_; }

 private:
  absl::string_view t_;
  size_t pos_ = 0;
};

}  // namespace

absl::Status ExtractJsonStrings(
    absl::string_view text, absl::Span<const std::string> keys,
    std::vector<std::optional<std::string>>* values) {
  values->assign(keys.size(), std::nullopt);
  Parser p(text);
  if (!p.Consume('{')) return p.Error("expected a JSON object");
  if (!p.Consume('}')) {
    std::string key;
    while (true) {
      key.clear();
      absl::Status s = p.String(&key);
      if (!s.ok()) return s;
      if (!p.Consume(':')) return p.Error("expected ':'");
      int which = -1;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (keys[i] == key) which = static_cast<int>(i);
      }
      if (which >= 0) {
        if (p.Peek() != '"') {
          return p.Error(
              absl::StrCat("value of key \"", key, "\" is not a string"));
        }
        std::string v;
        s = p.String(&v);
        if (!s.ok()) return s;
        (*values)[which] = std::move(v);
      } else {
        s = p.SkipValue(0);
        if (!s.ok()) return s;
      }
      if (p.Consume('}')) break;
      if (!p.Consume(',')) return p.Error("expected ',' or '}'");
    }
  }
  if (!p.AtEnd()) return p.Error("trailing characters after the object");
  return absl::OkStatus();
}

absl::Status ParseJsonStringToInt(
    absl::string_view text, std::vector<std::pair<std::string, int64_t>>* out) {
  out->clear();
  Parser p(text);
  if (!p.Consume('{')) return p.Error("expected a JSON object");
  if (p.Consume('}')) return absl::OkStatus();
  while (true) {
    std::string key;
    absl::Status s = p.String(&key);
    if (!s.ok()) return s;
    if (!p.Consume(':')) return p.Error("expected ':'");
    int64_t v;
    s = p.Number(&v);
    if (!s.ok()) return s;
    out->emplace_back(std::move(key), v);
    if (p.Consume('}')) break;
    if (!p.Consume(',')) return p.Error("expected ',' or '}'");
  }
  if (!p.AtEnd()) return p.Error("trailing characters after the object");
  return absl::OkStatus();
}

}  // namespace mcc::data
