#include "checkpoint/json.h"

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/json_text.h"

namespace mcc {
namespace json {
namespace {

class Parser {
 public:
  explicit Parser(absl::string_view s) : s_(s) {}

  absl::StatusOr<Value> Document() {
    Value v;
    auto st = ParseValue(&v, 0);
    if (!st.ok()) return st;
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing characters");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON: ", what, " at byte ", pos_));
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' ||
                                s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Literal(absl::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status ParseValue(Value* v, int depth) {
    if (depth > 64) return Error("nesting too deep");
    SkipSpace();
    if (pos_ >= s_.size()) return Error("unexpected end");
    const char c = s_[pos_];
    if (c == '{') return ParseObject(v, depth);
    if (c == '[') return ParseArray(v, depth);
    if (c == '"') {
      v->kind = Value::Kind::kString;
      return ParseString(&v->text);
    }
    if (Literal("true")) {
      v->kind = Value::Kind::kBool;
      v->boolean = true;
      return absl::OkStatus();
    }
    if (Literal("false")) {
      v->kind = Value::Kind::kBool;
      return absl::OkStatus();
    }
    if (Literal("null")) return absl::OkStatus();
    if (c == '-' || (c >= '0' && c <= '9')) {
      const size_t start = pos_;
      while (pos_ < s_.size() &&
             absl::string_view("+-0123456789.eE").find(s_[pos_]) !=
                 absl::string_view::npos) {
        ++pos_;
      }
      v->kind = Value::Kind::kNumber;
      v->text = std::string(s_.substr(start, pos_ - start));
      double d;
      if (!absl::SimpleAtod(v->text, &d)) return Error("bad number");
      return absl::OkStatus();
    }
    return Error(
        absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  absl::Status ParseObject(Value* v, int depth) {
    v->kind = Value::Kind::kObject;
    ++pos_;
    std::set<std::string> keys;
    if (Consume('}')) return absl::OkStatus();
    do {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Error("expected a key");
      std::string key;
      if (auto st = ParseString(&key); !st.ok()) return st;
      if (!keys.insert(key).second) {
        return Error(absl::StrCat("duplicate key \"", key, "\""));
      }
      if (!Consume(':')) return Error("expected ':'");
      Value member;
      if (auto st = ParseValue(&member, depth + 1); !st.ok()) return st;
      v->object.emplace_back(std::move(key), std::move(member));
    } while (Consume(','));
    if (!Consume('}')) return Error("expected ',' or '}'");
    return absl::OkStatus();
  }

  absl::Status ParseArray(Value* v, int depth) {
    v->kind = Value::Kind::kArray;
    ++pos_;
    if (Consume(']')) return absl::OkStatus();
    do {
      Value item;
      if (auto st = ParseValue(&item, depth + 1); !st.ok()) return st;
      v->array.push_back(std::move(item));
    } while (Consume(','));
    if (!Consume(']')) return Error("expected ',' or ']'");
    return absl::OkStatus();
  }

  absl::Status Hex4(uint32_t* out) {
    if (pos_ + 4 > s_.size()) return Error("short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= h - '0';
      else if (h >= 'a' && h <= 'f')
        v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F')
        v |= h - 'A' + 10;
      else
        return Error("bad \\u escape");
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // Opening quote.
    while (true) {
      if (pos_ >= s_.size()) return Error("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<unsigned char>(c) < 0x20) {
        return Error("control character in string");
      }
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) return Error("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          if (auto st = Hex4(&cp); !st.ok()) return st;
          if (cp >= 0xD800 && cp < 0xDC00) {
            uint32_t lo = 0;
            if (!Literal("\\u")) return Error("lone surrogate");
            if (auto st = Hex4(&lo); !st.ok()) return st;
            if (lo < 0xDC00 || lo >= 0xE000) return Error("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Error("bad escape");
      }
    }
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

const Value* Value::Find(absl::string_view key) const {
  for (const auto& [k, v] : object) {
    if (k == key) return &v;
  }
  return nullptr;
}

absl::StatusOr<int64_t> Value::AsInt() const {
  int64_t v;
  if (kind != Kind::kNumber || !absl::SimpleAtoi(text, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON: expected an integer, got \"", text, "\""));
  }
  return v;
}

absl::StatusOr<Value> Parse(absl::string_view text) {
  return Parser(text).Document();
}

std::string Quote(absl::string_view s) {
  std::string out;
  AppendJsonString(s, &out);
  return out;
}

}  // namespace json
}  // namespace mcc
