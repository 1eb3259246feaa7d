#include "models/gpt/moe_layer_pattern.h"

#include <cctype>
#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mcc {
namespace gpt {
namespace {

// Recursive descent over the list-expression subset:
//   expr   := term ('+' term)*
//   term   := factor ('*' int)*
//   factor := '[' [int (',' int)*] ']' | '(' expr ')'
class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) {}

  absl::StatusOr<std::vector<int>> Parse() {
    auto list = Expr();
    if (!list.ok()) return list;
    Skip();
    if (pos_ != text_.size()) return Error("unexpected text");
    return list;
  }

 private:
  static constexpr int64_t kMaxLength = 1 << 20;

  void Skip() {
    while (pos_ < text_.size() &&
           std::isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }
  bool Take(char c) {
    Skip();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe-layer-freq '", text_, "': ", what, " at offset ", pos_,
        " (an integer or a list such as [1,0,1,0] or "
        "([0]+[1]*3))"));
  }
  absl::StatusOr<int64_t> Int() {
    Skip();
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
    int64_t v = 0;
    if (pos_ == start || pos_ - start > 9 ||
        !absl::SimpleAtoi(text_.substr(start, pos_ - start), &v)) {
      return Error("expected a non-negative integer");
    }
    return v;
  }
  absl::StatusOr<std::vector<int>> Expr() {
    auto out = Term();
    if (!out.ok()) return out;
    while (Take('+')) {
      auto more = Term();
      if (!more.ok()) return more;
      out->insert(out->end(), more->begin(), more->end());
      if (static_cast<int64_t>(out->size()) > kMaxLength) {
        return Error("list too long");
      }
    }
    return out;
  }
  absl::StatusOr<std::vector<int>> Term() {
    auto out = Factor();
    if (!out.ok()) return out;
    while (Take('*')) {
      auto n = Int();
      if (!n.ok()) return n.status();
      if (*n * static_cast<int64_t>(out->size()) > kMaxLength) {
        return Error("list too long");
      }
      std::vector<int> repeated;
      for (int64_t i = 0; i < *n; ++i) {
        repeated.insert(repeated.end(), out->begin(), out->end());
      }
      *out = std::move(repeated);
    }
    return out;
  }
  absl::StatusOr<std::vector<int>> Factor() {
    if (Take('(')) {
      auto out = Expr();
      if (!out.ok()) return out;
      if (!Take(')')) return Error("expected ')'");
      return out;
    }
    if (!Take('[')) return Error("expected '[' or '('");
    std::vector<int> out;
    if (Take(']')) return out;
    do {
      auto v = Int();
      if (!v.ok()) return v.status();
      if (*v > 1) return Error(absl::StrCat("entry ", *v, " is not 0 or 1"));
      out.push_back(static_cast<int>(*v));
    } while (Take(','));
    if (!Take(']')) return Error("expected ']' or ','");
    return out;
  }

  const std::string& text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<bool>> ParseMoeLayerFreq(const std::string& freq,
                                                    int num_layers) {
  if (num_layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe-layer-freq: --num-layers ", num_layers, " must be positive"));
  }
  int64_t every = 0;
  if (absl::SimpleAtoi(freq, &every)) {
    if (every < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--moe-layer-freq ", freq, ": an integer must be at least 1"));
    }
    std::vector<bool> out(num_layers);
    for (int i = 0; i < num_layers; ++i) out[i] = i % every == 0;
    return out;
  }
  auto list = Parser(freq).Parse();
  if (!list.ok()) return list.status();
  if (static_cast<int64_t>(list->size()) != num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--moe-layer-freq '", freq, "' lists ", list->size(),
                     " layers, but --num-layers is ", num_layers));
  }
  return std::vector<bool>(list->begin(), list->end());
}

std::string MoeLayerPatternString(const std::vector<bool>& pattern) {
  return absl::StrCat("[",
                      absl::StrJoin(pattern, ",",
                                    [](std::string* out, bool moe) {
                                      out->push_back(moe ? '1' : '0');
                                    }),
                      "]");
}

}  // namespace gpt
}  // namespace mcc
