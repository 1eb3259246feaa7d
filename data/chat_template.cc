#include "data/chat_template.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"

namespace mcc::data {
namespace {

// ---------------------------------------------------------------- values

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order

// A Jinja value. Strings, lists and dicts are shared and immutable, so
// copying a value is cheap whatever it holds.
struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kString, kList, kDict };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  std::shared_ptr<const std::string> s;
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;
  int depth = 0;  // nesting of lists and dicts

  static Value None() {
    Value v;
    v.kind = Kind::kNone;
    return v;
  }
  static Value Bool(bool x) {
    Value v;
    v.kind = Kind::kBool;
    v.b = x;
    return v;
  }
  static Value Int(int64_t x) {
    Value v;
    v.kind = Kind::kInt;
    v.i = x;
    return v;
  }
  static Value Str(std::string x) {
    Value v;
    v.kind = Kind::kString;
    v.s = std::make_shared<const std::string>(std::move(x));
    return v;
  }
  static Value MakeList(List x) {
    Value v;
    v.kind = Kind::kList;
    for (const Value& e : x) v.depth = std::max(v.depth, e.depth + 1);
    v.list = std::make_shared<const List>(std::move(x));
    return v;
  }
  static Value MakeDict(Dict x) {
    Value v;
    v.kind = Kind::kDict;
    for (const auto& e : x) v.depth = std::max(v.depth, e.second.depth + 1);
    v.dict = std::make_shared<const Dict>(std::move(x));
    return v;
  }
  bool is(Kind k) const { return kind == k; }
  const std::string& str() const { return *s; }
};

using Kind = Value::Kind;

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kString:
      return !v.s->empty();
    case Kind::kList:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->empty();
  }
  return false;
}

const Value* DictFind(const Dict& d, absl::string_view key) {
  for (const auto& [k, v] : d) {
    if (k == key) return &v;
  }
  return nullptr;
}

// ---------------------------------------------------------------- syntax

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Op {
    kLiteral,  // value
    kName,     // name
    kAttr,     // args[0].name
    kIndex,    // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null parts absent)
    kCall,     // args[0](args[1..]); args[0] is a name or an attribute
    kFilter,   // args[0] | name(args[1..])
    kTest,     // args[0] is [not] name(args[1..]); negate
    kNot,      // not args[0]
    kNeg,      // -args[0]
    kBinary,   // args[0] name args[1]
    kAnd,
    kOr,
    kTernary,  // args[0] if args[1] else args[2] (args[2] may be null)
    kList,
    kDict,  // args: key, value, key, value...
  };
  Op op;
  size_t pos = 0;
  Value value;
  std::string name;
  bool negate = false;
  std::vector<ExprPtr> args;
  // Keyword arguments of a call or filter: tojson(indent=4).
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Type { kText, kOutput, kIf, kFor, kSet };
  Type type;
  size_t pos = 0;
  std::string text;            // kText; kSet and kFor: the variable
  ExprPtr expr;                // kOutput, kSet value, kFor iterable
  std::vector<ExprPtr> conds;  // kIf: one per branch; null for else
  std::vector<Body> branches;  // kIf: the bodies; kFor: body [, else]
};

}  // namespace

struct ChatTemplate::Program {
  Body body;
  ChatTemplateLimits limits;
  std::string source;  // for line:column in errors
};

namespace {

std::string Where(absl::string_view source, size_t pos) {
  pos = std::min(pos, source.size());
  int line = 1, col = 1;
  for (size_t i = 0; i < pos; ++i) {
    if (source[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return absl::StrCat(line, ":", col);
}

absl::Status Error(absl::string_view source, size_t pos,
                   absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat template: ", what, " at ", Where(source, pos)));
}

absl::Status Unsupported(absl::string_view source, size_t pos,
                         absl::string_view what) {
  return Error(source, pos, absl::StrCat(what, " is not supported"));
}

// ---------------------------------------------------------------- lexing

struct Token {
  enum class Type { kName, kInt, kString, kOp, kEnd };
  Type type;
  std::string text;  // name, operator, or the string's value
  int64_t number = 0;
  size_t pos = 0;
};

bool IsNameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

bool IsKnown(absl::string_view name, std::initializer_list<const char*> known) {
  for (const char* k : known) {
    if (name == k) return true;
  }
  return false;
}

// The filters, tests, functions and methods Renderer implements; anything
// else is refused when the template is parsed.
bool KnownFilter(absl::string_view n) {
  return IsKnown(n, {"trim", "length", "count", "upper", "lower", "capitalize",
                     "title", "string", "int", "first", "last", "default", "d",
                     "join", "reverse", "tojson", "select", "reject"});
}
bool KnownTest(absl::string_view n) {
  return IsKnown(
      n, {"defined", "undefined", "none", "string", "number", "integer",
          "boolean", "mapping", "sequence", "iterable", "true", "false", "even",
          "odd", "equalto", "eq", "==", "ne", "!="});
}
bool KnownFunction(absl::string_view n) {
  return IsKnown(n, {"raise_exception", "range", "strftime_now"});
}
bool KnownMethod(absl::string_view n) {
  return IsKnown(n, {"strip", "lstrip", "rstrip", "upper", "lower", "title",
                     "capitalize", "startswith", "endswith", "replace", "split",
                     "get", "keys", "values", "items"});
}

class Parser {
 public:
  Parser(absl::string_view source, const ChatTemplateLimits& limits)
      : src_(source), limits_(limits) {}

  absl::StatusOr<Body> ParseTemplate();

 private:
  // -- the template level.
  enum class TagKind { kText, kOutput, kBlock, kEof };
  struct Segment {
    TagKind kind;
    size_t pos;
    std::string text;           // kText
    std::vector<Token> tokens;  // kOutput, kBlock (without delimiters)
  };
  absl::Status Segment_();
  absl::StatusOr<std::vector<Token>> LexTag(size_t* i, bool block);

  // -- statements over segments_.
  absl::StatusOr<Body> ParseBody(int depth, std::vector<std::string> ends,
                                 std::string* ended_by);

  // -- expressions over toks_.
  const Token& Peek() const { return (*toks_)[tp_]; }
  bool AtOp(absl::string_view op) const {
    return Peek().type == Token::Type::kOp && Peek().text == op;
  }
  bool AtName(absl::string_view name) const {
    return Peek().type == Token::Type::kName && Peek().text == name;
  }
  absl::Status Expect(absl::string_view op);
  absl::StatusOr<std::string> ExpectName();
  absl::StatusOr<ExprPtr> ParseExpr(int depth);
  absl::StatusOr<ExprPtr> ParseOr(int depth);
  absl::StatusOr<ExprPtr> ParseAnd(int depth);
  absl::StatusOr<ExprPtr> ParseNot(int depth);
  absl::StatusOr<ExprPtr> ParseCompare(int depth);
  absl::StatusOr<ExprPtr> ParseAdd(int depth);
  absl::StatusOr<ExprPtr> ParseConcat(int depth);
  absl::StatusOr<ExprPtr> ParseMul(int depth);
  absl::StatusOr<ExprPtr> ParseUnary(int depth);
  absl::StatusOr<ExprPtr> ParsePostfix(int depth);
  absl::StatusOr<ExprPtr> ParsePrimary(int depth);
  absl::StatusOr<ExprPtr> ParseFilters(ExprPtr e, int depth);
  absl::Status ParseArgs(Expr* call, int depth);
  // The parsed expression, unless its tree is deeper than rendering's
  // recursion allows (long operator chains nest too).
  absl::StatusOr<ExprPtr> Checked(absl::StatusOr<ExprPtr> e);
  absl::Status Deeper(int depth) const {
    if (depth > limits_.max_depth) {
      return Error(src_, Peek().pos,
                   absl::StrCat("nesting deeper than ", limits_.max_depth));
    }
    return absl::OkStatus();
  }

  absl::string_view src_;
  ChatTemplateLimits limits_;
  std::vector<Segment> segments_;
  size_t sp_ = 0;  // next segment
  const std::vector<Token>* toks_ = nullptr;
  size_t tp_ = 0;  // next token
};

absl::StatusOr<std::vector<Token>> Parser::LexTag(size_t* pi, bool block) {
  const absl::string_view close = block ? "%}" : "}}";
  std::vector<Token> out;
  size_t i = *pi;
  while (true) {
    while (i < src_.size() && std::isspace(static_cast<unsigned char>(src_[i])))
      ++i;
    if (i >= src_.size()) return Error(src_, *pi, "unclosed tag");
    // The closing delimiter, with its whitespace-control sign.
    if ((src_[i] == '-' || src_[i] == '+') && src_.substr(i + 1, 2) == close) {
      out.push_back({Token::Type::kEnd, std::string(1, src_[i]), 0, i});
      *pi = i + 3;
      return out;
    }
    if (src_.substr(i, 2) == close) {
      out.push_back({Token::Type::kEnd, "", 0, i});
      *pi = i + 2;
      return out;
    }
    const char c = src_[i];
    const size_t start = i;
    if (IsNameStart(c)) {
      while (i < src_.size() && IsNameChar(src_[i])) ++i;
      out.push_back({Token::Type::kName,
                     std::string(src_.substr(start, i - start)), 0, start});
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      while (
          i < src_.size() &&
          (std::isdigit(static_cast<unsigned char>(src_[i])) || src_[i] == '_'))
        ++i;
      if (i < src_.size() &&
          (src_[i] == '.' || src_[i] == 'e' || src_[i] == 'E')) {
        return Unsupported(src_, start, "a float literal");
      }
      std::string digits;
      for (char d : src_.substr(start, i - start)) {
        if (d != '_') digits.push_back(d);
      }
      int64_t n = 0;
      if (!absl::SimpleAtoi(digits, &n)) {
        return Error(src_, start, "integer literal out of range");
      }
      out.push_back({Token::Type::kInt, "", n, start});
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string s;
      ++i;
      while (true) {
        if (i >= src_.size()) return Error(src_, start, "unclosed string");
        const char d = src_[i];
        if (d == c) {
          ++i;
          break;
        }
        if (d == '\\' && i + 1 < src_.size()) {
          const char e = src_[i + 1];
          i += 2;
          switch (e) {
            case 'n':
              s.push_back('\n');
              break;
            case 't':
              s.push_back('\t');
              break;
            case 'r':
              s.push_back('\r');
              break;
            case '\\':
            case '\'':
            case '"':
              s.push_back(e);
              break;
            default:  // Python keeps an unknown escape as written.
              s.push_back('\\');
              s.push_back(e);
          }
          continue;
        }
        s.push_back(d);
        ++i;
      }
      out.push_back({Token::Type::kString, std::move(s), 0, start});
      continue;
    }
    static const char* const kOps[] = {
        "//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".",
        ",",  ":",  "|",  "~",  "+",  "-",  "*", "/", "%", "<", ">", "="};
    bool matched = false;
    for (const char* op : kOps) {
      if (src_.substr(i, strlen(op)) == op) {
        out.push_back({Token::Type::kOp, op, 0, i});
        i += strlen(op);
        matched = true;
        break;
      }
    }
    if (!matched) {
      return Error(src_, i,
                   absl::StrCat("unexpected character '",
                                absl::CEscape(src_.substr(i, 1)), "'"));
    }
  }
}

// Splits the source into text, {{ }} and {% %} segments, applying comments
// and whitespace control as transformers' Jinja environment does.
absl::Status Parser::Segment_() {
  size_t i = 0;
  bool trim_next = false;     // strip the next text's leading whitespace
  bool trim_newline = false;  // trim_blocks: drop one leading newline
  auto add_text = [&](size_t from, size_t to) {
    std::string t(src_.substr(from, to - from));
    if (trim_next) {
      size_t k = 0;
      while (k < t.size() && std::isspace(static_cast<unsigned char>(t[k])))
        ++k;
      t.erase(0, k);
    } else if (trim_newline) {
      if (absl::StartsWith(t, "\n")) {
        t.erase(0, 1);
      } else if (absl::StartsWith(t, "\r\n")) {
        t.erase(0, 2);
      }
    }
    trim_next = trim_newline = false;
    segments_.push_back({TagKind::kText, from, std::move(t), {}});
  };
  while (i <= src_.size()) {
    size_t open = src_.find('{', i);
    while (open != absl::string_view::npos && open + 1 < src_.size() &&
           src_[open + 1] != '{' && src_[open + 1] != '%' &&
           src_[open + 1] != '#') {
      open = src_.find('{', open + 1);
    }
    if (open == absl::string_view::npos || open + 1 >= src_.size()) {
      add_text(i, src_.size());
      break;
    }
    add_text(i, open);
    const char kind = src_[open + 1];
    size_t j = open + 2;
    const char sign = j < src_.size() ? src_[j] : '\0';
    if (sign == '-' || sign == '+') ++j;
    Segment& before = segments_.back();
    if (sign == '-') {
      while (!before.text.empty() &&
             std::isspace(static_cast<unsigned char>(before.text.back())))
        before.text.pop_back();
    } else if (kind != '{' && sign != '+') {
      // lstrip_blocks: a block tag's indentation on its own line goes.
      size_t q = open;
      while (q > 0 && (src_[q - 1] == ' ' || src_[q - 1] == '\t')) --q;
      if (q == 0 || src_[q - 1] == '\n') {
        size_t k = before.text.size();
        while (k > 0 &&
               (before.text[k - 1] == ' ' || before.text[k - 1] == '\t'))
          --k;
        before.text.resize(k);
      }
    }
    if (kind == '#') {
      size_t end = src_.find("#}", j);
      if (end == absl::string_view::npos)
        return Error(src_, open, "unclosed comment");
      const bool strip_after = end > j && src_[end - 1] == '-';
      i = end + 2;
      trim_next = strip_after;
      trim_newline = !strip_after;
      continue;
    }
    MCC_ASSIGN_OR_RETURN(std::vector<Token> toks, LexTag(&j, kind == '%'));
    const std::string end_sign = toks.back().text;
    i = j;
    trim_next = end_sign == "-";
    trim_newline = kind == '%' && end_sign.empty();
    segments_.push_back({kind == '%' ? TagKind::kBlock : TagKind::kOutput, open,
                         "", std::move(toks)});
  }
  segments_.push_back({TagKind::kEof, src_.size(), "", {}});
  return absl::OkStatus();
}

absl::StatusOr<ExprPtr> Parser::Checked(absl::StatusOr<ExprPtr> e) {
  if (!e.ok()) return e;
  // Iterative, so the check itself cannot run out of stack.
  std::vector<std::pair<const Expr*, int>> stack = {{e->get(), 1}};
  while (!stack.empty()) {
    auto [x, d] = stack.back();
    stack.pop_back();
    if (d > 4 * limits_.max_depth) {
      return Error(src_, x->pos,
                   absl::StrCat("an expression nested deeper than ",
                                4 * limits_.max_depth));
    }
    for (const ExprPtr& a : x->args) {
      if (a != nullptr) stack.emplace_back(a.get(), d + 1);
    }
    for (const auto& kw : x->kwargs) stack.emplace_back(kw.second.get(), d + 1);
  }
  return e;
}

absl::Status Parser::Expect(absl::string_view op) {
  if (!AtOp(op)) {
    return Error(src_, Peek().pos, absl::StrCat("expected '", op, "'"));
  }
  ++tp_;
  return absl::OkStatus();
}

absl::StatusOr<std::string> Parser::ExpectName() {
  if (Peek().type != Token::Type::kName) {
    return Error(src_, Peek().pos, "expected a name");
  }
  return (*toks_)[tp_++].text;
}

ExprPtr MakeExpr(Expr::Op op, size_t pos) {
  auto e = std::make_unique<Expr>();
  e->op = op;
  e->pos = pos;
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseExpr(int depth) {
  MCC_RETURN_IF_ERROR(Deeper(depth));
  MCC_ASSIGN_OR_RETURN(ExprPtr e, ParseOr(depth + 1));
  if (AtName("if")) {
    const size_t pos = Peek().pos;
    ++tp_;
    auto t = MakeExpr(Expr::Op::kTernary, pos);
    t->args.push_back(std::move(e));
    MCC_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr(depth + 1));
    t->args.push_back(std::move(cond));
    if (AtName("else")) {
      ++tp_;
      MCC_ASSIGN_OR_RETURN(ExprPtr other, ParseExpr(depth + 1));
      t->args.push_back(std::move(other));
    } else {
      t->args.push_back(nullptr);
    }
    return t;
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseOr(int depth) {
  MCC_ASSIGN_OR_RETURN(ExprPtr e, ParseAnd(depth));
  for (int n = 1; AtName("or"); ++n) {
    MCC_RETURN_IF_ERROR(Deeper(depth + n));
    auto o = MakeExpr(Expr::Op::kOr, Peek().pos);
    ++tp_;
    o->args.push_back(std::move(e));
    MCC_ASSIGN_OR_RETURN(ExprPtr r, ParseAnd(depth + n));
    o->args.push_back(std::move(r));
    e = std::move(o);
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseAnd(int depth) {
  MCC_ASSIGN_OR_RETURN(ExprPtr e, ParseNot(depth));
  for (int n = 1; AtName("and"); ++n) {
    MCC_RETURN_IF_ERROR(Deeper(depth + n));
    auto o = MakeExpr(Expr::Op::kAnd, Peek().pos);
    ++tp_;
    o->args.push_back(std::move(e));
    MCC_ASSIGN_OR_RETURN(ExprPtr r, ParseNot(depth + n));
    o->args.push_back(std::move(r));
    e = std::move(o);
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseNot(int depth) {
  if (AtName("not")) {
    MCC_RETURN_IF_ERROR(Deeper(depth + 1));
    auto n = MakeExpr(Expr::Op::kNot, Peek().pos);
    ++tp_;
    MCC_ASSIGN_OR_RETURN(ExprPtr inner, ParseNot(depth + 1));
    n->args.push_back(std::move(inner));
    return n;
  }
  return ParseCompare(depth);
}

absl::StatusOr<ExprPtr> Parser::ParseCompare(int depth) {
  MCC_ASSIGN_OR_RETURN(ExprPtr e, ParseAdd(depth));
  for (int n = 1;; ++n) {
    MCC_RETURN_IF_ERROR(Deeper(depth + n));
    const Token& t = Peek();
    std::string op;
    size_t advance = 1;
    if (t.type == Token::Type::kOp &&
        (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
         t.text == "<=" || t.text == ">=")) {
      op = t.text;
    } else if (AtName("in")) {
      op = "in";
    } else if (AtName("not") && tp_ + 1 < toks_->size() &&
               (*toks_)[tp_ + 1].type == Token::Type::kName &&
               (*toks_)[tp_ + 1].text == "in") {
      op = "not in";
      advance = 2;
    } else {
      break;
    }
    auto b = MakeExpr(Expr::Op::kBinary, t.pos);
    tp_ += advance;
    b->name = op;
    b->args.push_back(std::move(e));
    MCC_ASSIGN_OR_RETURN(ExprPtr r, ParseAdd(depth + n));
    b->args.push_back(std::move(r));
    e = std::move(b);
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseAdd(int depth) {
  MCC_ASSIGN_OR_RETURN(ExprPtr e, ParseConcat(depth));
  for (int n = 1; AtOp("+") || AtOp("-"); ++n) {
    MCC_RETURN_IF_ERROR(Deeper(depth + n));
    auto b = MakeExpr(Expr::Op::kBinary, Peek().pos);
    b->name = (*toks_)[tp_++].text;
    b->args.push_back(std::move(e));
    MCC_ASSIGN_OR_RETURN(ExprPtr r, ParseConcat(depth + n));
    b->args.push_back(std::move(r));
    e = std::move(b);
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseConcat(int depth) {
  MCC_ASSIGN_OR_RETURN(ExprPtr e, ParseMul(depth));
  for (int n = 1; AtOp("~"); ++n) {
    MCC_RETURN_IF_ERROR(Deeper(depth + n));
    auto b = MakeExpr(Expr::Op::kBinary, Peek().pos);
    b->name = (*toks_)[tp_++].text;
    b->args.push_back(std::move(e));
    MCC_ASSIGN_OR_RETURN(ExprPtr r, ParseMul(depth + n));
    b->args.push_back(std::move(r));
    e = std::move(b);
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseMul(int depth) {
  MCC_ASSIGN_OR_RETURN(ExprPtr e, ParseUnary(depth));
  for (int n = 1;
       AtOp("*") || AtOp("//") || AtOp("%") || AtOp("/") || AtOp("**"); ++n) {
    MCC_RETURN_IF_ERROR(Deeper(depth + n));
    if (AtOp("/")) return Unsupported(src_, Peek().pos, "'/' (true division)");
    if (AtOp("**")) return Unsupported(src_, Peek().pos, "'**'");
    auto b = MakeExpr(Expr::Op::kBinary, Peek().pos);
    b->name = (*toks_)[tp_++].text;
    b->args.push_back(std::move(e));
    MCC_ASSIGN_OR_RETURN(ExprPtr r, ParseUnary(depth + n));
    b->args.push_back(std::move(r));
    e = std::move(b);
  }
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseUnary(int depth) {
  MCC_RETURN_IF_ERROR(Deeper(depth));
  if (AtOp("-") || AtOp("+")) {
    const bool neg = AtOp("-");
    auto n = MakeExpr(Expr::Op::kNeg, Peek().pos);
    ++tp_;
    MCC_ASSIGN_OR_RETURN(ExprPtr inner, ParseUnary(depth + 1));
    if (!neg) return inner;
    n->args.push_back(std::move(inner));
    return ParseFilters(std::move(n), depth);
  }
  MCC_ASSIGN_OR_RETURN(ExprPtr e, ParsePostfix(depth));
  return ParseFilters(std::move(e), depth);
}

absl::Status Parser::ParseArgs(Expr* call, int depth) {
  MCC_RETURN_IF_ERROR(Expect("("));
  while (!AtOp(")")) {
    if (Peek().type == Token::Type::kName && tp_ + 1 < toks_->size() &&
        (*toks_)[tp_ + 1].type == Token::Type::kOp &&
        (*toks_)[tp_ + 1].text == "=") {
      std::string name = (*toks_)[tp_].text;
      tp_ += 2;
      MCC_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr(depth + 1));
      call->kwargs.emplace_back(std::move(name), std::move(v));
    } else {
      if (!call->kwargs.empty()) {
        return Error(src_, Peek().pos,
                     "a positional argument after a keyword argument");
      }
      MCC_ASSIGN_OR_RETURN(ExprPtr a, ParseExpr(depth + 1));
      call->args.push_back(std::move(a));
    }
    if (!AtOp(",")) break;
    ++tp_;
  }
  return Expect(")");
}

absl::StatusOr<ExprPtr> Parser::ParseFilters(ExprPtr e, int depth) {
  for (int n = 1;; ++n) {
    MCC_RETURN_IF_ERROR(Deeper(depth + n));
    if (AtOp("|")) {
      auto f = MakeExpr(Expr::Op::kFilter, Peek().pos);
      ++tp_;
      MCC_ASSIGN_OR_RETURN(f->name, ExpectName());
      if (!KnownFilter(f->name)) {
        return Unsupported(src_, f->pos,
                           absl::StrCat("the filter '", f->name, "'"));
      }
      f->args.push_back(std::move(e));
      if (AtOp("(")) MCC_RETURN_IF_ERROR(ParseArgs(f.get(), depth));
      e = std::move(f);
      continue;
    }
    if (AtName("is")) {
      auto t = MakeExpr(Expr::Op::kTest, Peek().pos);
      ++tp_;
      if (AtName("not")) {
        t->negate = true;
        ++tp_;
      }
      MCC_ASSIGN_OR_RETURN(t->name, ExpectName());
      if (!KnownTest(t->name)) {
        return Unsupported(src_, t->pos,
                           absl::StrCat("the test '", t->name, "'"));
      }
      t->args.push_back(std::move(e));
      if (AtOp("(")) MCC_RETURN_IF_ERROR(ParseArgs(t.get(), depth));
      e = std::move(t);
      continue;
    }
    return e;
  }
}

absl::StatusOr<ExprPtr> Parser::ParsePostfix(int depth) {
  MCC_ASSIGN_OR_RETURN(ExprPtr e, ParsePrimary(depth));
  for (int n = 1;; ++n) {
    MCC_RETURN_IF_ERROR(Deeper(depth + n));
    if (AtOp(".")) {
      auto a = MakeExpr(Expr::Op::kAttr, Peek().pos);
      ++tp_;
      if (Peek().type == Token::Type::kInt) {
        a->op = Expr::Op::kIndex;
        auto idx = MakeExpr(Expr::Op::kLiteral, Peek().pos);
        idx->value = Value::Int((*toks_)[tp_++].number);
        a->args.push_back(std::move(e));
        a->args.push_back(std::move(idx));
      } else {
        MCC_ASSIGN_OR_RETURN(a->name, ExpectName());
        a->args.push_back(std::move(e));
      }
      e = std::move(a);
      continue;
    }
    if (AtOp("[")) {
      const size_t pos = Peek().pos;
      ++tp_;
      std::vector<ExprPtr> parts(1);
      bool slice = false;
      while (true) {
        if (!AtOp(":") && !AtOp("]")) {
          MCC_ASSIGN_OR_RETURN(parts.back(), ParseExpr(depth + 1));
        }
        if (AtOp(":")) {
          ++tp_;
          slice = true;
          if (parts.size() == 3)
            return Error(src_, Peek().pos, "too many ':' in a slice");
          parts.emplace_back();
          continue;
        }
        break;
      }
      MCC_RETURN_IF_ERROR(Expect("]"));
      auto x = MakeExpr(slice ? Expr::Op::kSlice : Expr::Op::kIndex, pos);
      x->args.push_back(std::move(e));
      if (!slice && parts[0] == nullptr)
        return Error(src_, pos, "empty subscript");
      for (auto& p : parts) x->args.push_back(std::move(p));
      while (slice && x->args.size() < 4) x->args.push_back(nullptr);
      e = std::move(x);
      continue;
    }
    if (AtOp("(")) {
      if (e->op != Expr::Op::kName && e->op != Expr::Op::kAttr) {
        return Unsupported(src_, Peek().pos, "calling this expression");
      }
      if (e->op == Expr::Op::kName && !KnownFunction(e->name)) {
        return Unsupported(src_, e->pos,
                           absl::StrCat("the function '", e->name, "'"));
      }
      if (e->op == Expr::Op::kAttr && !KnownMethod(e->name)) {
        return Unsupported(src_, e->pos,
                           absl::StrCat("the method '", e->name, "'"));
      }
      auto c = MakeExpr(Expr::Op::kCall, Peek().pos);
      c->args.push_back(std::move(e));
      MCC_RETURN_IF_ERROR(ParseArgs(c.get(), depth));
      e = std::move(c);
      continue;
    }
    return e;
  }
}

absl::StatusOr<ExprPtr> Parser::ParsePrimary(int depth) {
  MCC_RETURN_IF_ERROR(Deeper(depth));
  const Token& t = Peek();
  switch (t.type) {
    case Token::Type::kEnd:
      return Error(src_, t.pos, "expected an expression");
    case Token::Type::kInt: {
      auto e = MakeExpr(Expr::Op::kLiteral, t.pos);
      e->value = Value::Int(t.number);
      ++tp_;
      return e;
    }
    case Token::Type::kString: {
      auto e = MakeExpr(Expr::Op::kLiteral, t.pos);
      std::string s = t.text;
      ++tp_;
      // Adjacent literals join, as in Python.
      while (Peek().type == Token::Type::kString) s += (*toks_)[tp_++].text;
      e->value = Value::Str(std::move(s));
      return e;
    }
    case Token::Type::kName: {
      auto e = MakeExpr(Expr::Op::kLiteral, t.pos);
      const std::string& n = t.text;
      if (n == "true" || n == "True") {
        e->value = Value::Bool(true);
      } else if (n == "false" || n == "False") {
        e->value = Value::Bool(false);
      } else if (n == "none" || n == "None") {
        e->value = Value::None();
      } else {
        e->op = Expr::Op::kName;
        e->name = n;
      }
      ++tp_;
      return e;
    }
    case Token::Type::kOp:
      break;
  }
  if (AtOp("(")) {
    ++tp_;
    MCC_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr(depth + 1));
    if (AtOp(",")) return Unsupported(src_, Peek().pos, "a tuple");
    MCC_RETURN_IF_ERROR(Expect(")"));
    return e;
  }
  if (AtOp("[")) {
    auto l = MakeExpr(Expr::Op::kList, Peek().pos);
    ++tp_;
    while (!AtOp("]")) {
      MCC_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr(depth + 1));
      l->args.push_back(std::move(item));
      if (!AtOp(",")) break;
      ++tp_;
    }
    MCC_RETURN_IF_ERROR(Expect("]"));
    return l;
  }
  if (AtOp("{")) {
    auto d = MakeExpr(Expr::Op::kDict, Peek().pos);
    ++tp_;
    while (!AtOp("}")) {
      MCC_ASSIGN_OR_RETURN(ExprPtr k, ParseExpr(depth + 1));
      MCC_RETURN_IF_ERROR(Expect(":"));
      MCC_ASSIGN_OR_RETURN(ExprPtr v, ParseExpr(depth + 1));
      d->args.push_back(std::move(k));
      d->args.push_back(std::move(v));
      if (!AtOp(",")) break;
      ++tp_;
    }
    MCC_RETURN_IF_ERROR(Expect("}"));
    return d;
  }
  return Error(src_, t.pos, absl::StrCat("unexpected '", t.text, "'"));
}

// Statements Jinja has that this subset refuses by name.
bool IsRefusedStatement(absl::string_view kw) {
  static const char* const kRefused[] = {
      "macro",         "endmacro",  "call",     "endcall", "block",
      "endblock",      "extends",   "include",  "import",  "from",
      "filter",        "endfilter", "with",     "endwith", "raw",
      "endraw",        "break",     "continue", "do",      "autoescape",
      "endautoescape", "trans",     "endtrans"};
  for (const char* r : kRefused) {
    if (kw == r) return true;
  }
  return false;
}

absl::StatusOr<Body> Parser::ParseBody(int depth, std::vector<std::string> ends,
                                       std::string* ended_by) {
  if (depth > limits_.max_depth) {
    return Error(src_, segments_[sp_].pos,
                 absl::StrCat("blocks nested deeper than ", limits_.max_depth));
  }
  Body body;
  while (true) {
    const Segment& seg = segments_[sp_];
    if (seg.kind == TagKind::kEof) {
      if (ends.empty()) return body;
      return Error(src_, seg.pos, absl::StrCat("missing {% ", ends[0], " %}"));
    }
    ++sp_;
    if (seg.kind == TagKind::kText) {
      if (seg.text.empty()) continue;
      Node n;
      n.type = Node::Type::kText;
      n.pos = seg.pos;
      n.text = seg.text;
      body.push_back(std::move(n));
      continue;
    }
    toks_ = &seg.tokens;
    tp_ = 0;
    if (seg.kind == TagKind::kOutput) {
      Node n;
      n.type = Node::Type::kOutput;
      n.pos = seg.pos;
      MCC_ASSIGN_OR_RETURN(n.expr, Checked(ParseExpr(0)));
      if (Peek().type != Token::Type::kEnd)
        return Error(src_, Peek().pos, "expected '}}'");
      body.push_back(std::move(n));
      continue;
    }
    // A block tag.
    MCC_ASSIGN_OR_RETURN(const std::string kw, ExpectName());
    if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
      *ended_by = kw;
      --sp_;  // the caller reads the tag's arguments
      return body;
    }
    auto at_end = [&]() -> absl::Status {
      if (Peek().type != Token::Type::kEnd) {
        return Error(
            src_, Peek().pos,
            absl::StrCat("unexpected '", Peek().text, "' in {% ", kw, " %}"));
      }
      return absl::OkStatus();
    };
    Node n;
    n.pos = seg.pos;
    if (kw == "if") {
      n.type = Node::Type::kIf;
      MCC_ASSIGN_OR_RETURN(ExprPtr cond, Checked(ParseExpr(0)));
      MCC_RETURN_IF_ERROR(at_end());
      n.conds.push_back(std::move(cond));
      while (true) {
        std::string ended;
        MCC_ASSIGN_OR_RETURN(
            Body b, ParseBody(depth + 1, {"elif", "else", "endif"}, &ended));
        n.branches.push_back(std::move(b));
        const Segment& tag = segments_[sp_++];
        toks_ = &tag.tokens;
        tp_ = 1;
        if (ended == "endif") {
          MCC_RETURN_IF_ERROR(at_end());
          break;
        }
        if (ended == "elif") {
          MCC_ASSIGN_OR_RETURN(ExprPtr c, Checked(ParseExpr(0)));
          MCC_RETURN_IF_ERROR(at_end());
          n.conds.push_back(std::move(c));
          continue;
        }
        MCC_RETURN_IF_ERROR(at_end());  // else
        n.conds.push_back(nullptr);
        MCC_ASSIGN_OR_RETURN(Body e, ParseBody(depth + 1, {"endif"}, &ended));
        n.branches.push_back(std::move(e));
        const Segment& endtag = segments_[sp_++];
        toks_ = &endtag.tokens;
        tp_ = 1;
        MCC_RETURN_IF_ERROR(at_end());
        break;
      }
    } else if (kw == "for") {
      n.type = Node::Type::kFor;
      MCC_ASSIGN_OR_RETURN(n.text, ExpectName());
      if (AtOp(",")) {
        return Unsupported(src_, Peek().pos, "a for loop with several targets");
      }
      if (!AtName("in")) return Error(src_, Peek().pos, "expected 'in'");
      ++tp_;
      MCC_ASSIGN_OR_RETURN(n.expr, Checked(ParseOr(0)));
      if (AtName("if")) return Unsupported(src_, Peek().pos, "a loop filter");
      if (AtName("recursive"))
        return Unsupported(src_, Peek().pos, "a recursive loop");
      MCC_RETURN_IF_ERROR(at_end());
      std::string ended;
      MCC_ASSIGN_OR_RETURN(Body b,
                           ParseBody(depth + 1, {"else", "endfor"}, &ended));
      n.branches.push_back(std::move(b));
      const Segment& tag = segments_[sp_++];
      toks_ = &tag.tokens;
      tp_ = 1;
      MCC_RETURN_IF_ERROR(at_end());
      if (ended == "else") {
        MCC_ASSIGN_OR_RETURN(Body e, ParseBody(depth + 1, {"endfor"}, &ended));
        n.branches.push_back(std::move(e));
        const Segment& endtag = segments_[sp_++];
        toks_ = &endtag.tokens;
        tp_ = 1;
        MCC_RETURN_IF_ERROR(at_end());
      }
    } else if (kw == "set") {
      n.type = Node::Type::kSet;
      MCC_ASSIGN_OR_RETURN(n.text, ExpectName());
      if (AtOp(".")) {
        return Unsupported(src_, Peek().pos,
                           "setting an attribute (namespace objects)");
      }
      if (AtOp(",")) {
        return Unsupported(src_, Peek().pos, "a set with several targets");
      }
      if (Peek().type == Token::Type::kEnd) {
        return Unsupported(src_, seg.pos, "a block set ({% set x %}...)");
      }
      MCC_RETURN_IF_ERROR(Expect("="));
      MCC_ASSIGN_OR_RETURN(n.expr, Checked(ParseExpr(0)));
      MCC_RETURN_IF_ERROR(at_end());
    } else if (kw == "generation") {
      // transformers' assistant-mask markers: their body renders as is.
      MCC_RETURN_IF_ERROR(at_end());
      std::string ended;
      MCC_ASSIGN_OR_RETURN(Body b,
                           ParseBody(depth + 1, {"endgeneration"}, &ended));
      const Segment& tag = segments_[sp_++];
      toks_ = &tag.tokens;
      tp_ = 1;
      MCC_RETURN_IF_ERROR(at_end());
      for (Node& inner : b) body.push_back(std::move(inner));
      continue;
    } else if (IsRefusedStatement(kw)) {
      return Unsupported(src_, seg.pos, absl::StrCat("{% ", kw, " %}"));
    } else {
      return Error(src_, seg.pos,
                   absl::StrCat("unknown or misplaced tag {% ", kw, " %}"));
    }
    body.push_back(std::move(n));
  }
}

absl::StatusOr<Body> Parser::ParseTemplate() {
  MCC_RETURN_IF_ERROR(Segment_());
  std::string ended;
  MCC_ASSIGN_OR_RETURN(Body body, ParseBody(0, {}, &ended));
  return body;
}

// ---------------------------------------------------------------- rendering

class Renderer {
 public:
  Renderer(const ChatTemplate::Program& p, std::string* out)
      : p_(p), out_(out) {}

  absl::Status Run(const ChatTemplateInputs& in);

 private:
  absl::Status Exec(const Body& body);
  absl::StatusOr<Value> Eval(const Expr& e);
  absl::StatusOr<Value> Binary(const Expr& e, const Value& a, const Value& b);
  absl::StatusOr<Value> Filter(const Expr& e, const Value& v,
                               const std::map<std::string, Value>& kwargs,
                               const std::vector<Value>& args);
  absl::StatusOr<bool> Test(const Expr& e, const std::string& t, const Value& v,
                            const std::vector<Value>& args);
  absl::StatusOr<Value> Call(const Expr& e);
  absl::StatusOr<Value> Method(const Expr& e, const Value& self,
                               const std::string& name,
                               const std::vector<Value>& args);
  absl::StatusOr<Value> Attr(const Expr& e, const Value& v,
                             const std::string& name);
  absl::StatusOr<Value> Index(const Expr& e, const Value& v, const Value& k);
  absl::StatusOr<std::string> ToString(const Expr& e, const Value& v);
  // json with indent >= 0: Python's json.dumps(indent=...) layout.
  absl::Status Repr(const Expr& e, const Value& v, bool json, std::string* out,
                    int indent = -1, int level = 0);
  absl::Status Charge(const Expr* e, int64_t units);
  absl::StatusOr<Value> NewString(const Expr& e, std::string s);
  absl::StatusOr<bool> Equal(const Expr& e, const Value& a, const Value& b);
  absl::Status Fail(const Expr& e, absl::string_view what) {
    return Error(p_.source, e.pos, what);
  }
  absl::Status FailNode(size_t pos, absl::string_view what) {
    return Error(p_.source, pos, what);
  }

  const Value* Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  const ChatTemplate::Program& p_;
  std::string* out_;
  std::vector<std::map<std::string, Value>> scopes_;
  int64_t steps_ = 0;
};

absl::Status Renderer::Charge(const Expr* e, int64_t units) {
  steps_ += units;
  if (steps_ > p_.limits.max_steps) {
    return Error(
        p_.source, e ? e->pos : 0,
        absl::StrCat("rendering ran past ", p_.limits.max_steps, " steps"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Renderer::NewString(const Expr& e, std::string s) {
  if (static_cast<int64_t>(s.size()) > p_.limits.max_output_bytes) {
    return Fail(e, absl::StrCat("a string longer than ",
                                p_.limits.max_output_bytes, " bytes"));
  }
  MCC_RETURN_IF_ERROR(Charge(&e, static_cast<int64_t>(s.size()) / 16));
  return Value::Str(std::move(s));
}

absl::Status Renderer::Run(const ChatTemplateInputs& in) {
  std::map<std::string, Value> globals;
  List messages;
  for (const ChatMessage& m : in.messages) {
    messages.push_back(Value::MakeDict(
        {{"role", Value::Str(m.role)}, {"content", Value::Str(m.content)}}));
  }
  globals["messages"] = Value::MakeList(std::move(messages));
  globals["add_generation_prompt"] = Value::Bool(in.add_generation_prompt);
  globals["bos_token"] = Value::Str(in.bos_token);
  globals["eos_token"] = Value::Str(in.eos_token);
  // Defined, as in transformers' environment (`strftime_now is defined`).
  for (const char* fn : {"raise_exception", "range", "strftime_now"}) {
    globals[fn] = Value::Str(absl::StrCat("<function ", fn, ">"));
  }
  scopes_.push_back(std::move(globals));
  scopes_.emplace_back();  // the template's own sets
  return Exec(p_.body);
}

absl::Status Renderer::Exec(const Body& body) {
  for (const Node& n : body) {
    MCC_RETURN_IF_ERROR(Charge(nullptr, 1));
    switch (n.type) {
      case Node::Type::kText:
      case Node::Type::kOutput: {
        std::string text;
        if (n.type == Node::Type::kText) {
          text = n.text;
        } else {
          MCC_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
          MCC_ASSIGN_OR_RETURN(text, ToString(*n.expr, v));
        }
        if (static_cast<int64_t>(out_->size() + text.size()) >
            p_.limits.max_output_bytes) {
          return FailNode(n.pos,
                          absl::StrCat("output longer than ",
                                       p_.limits.max_output_bytes, " bytes"));
        }
        MCC_RETURN_IF_ERROR(
            Charge(nullptr, static_cast<int64_t>(text.size()) / 16));
        out_->append(text);
        break;
      }
      case Node::Type::kSet: {
        MCC_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        scopes_.back()[n.text] = std::move(v);
        break;
      }
      case Node::Type::kIf:
        for (size_t b = 0; b < n.branches.size(); ++b) {
          bool take = n.conds[b] == nullptr;
          if (!take) {
            MCC_ASSIGN_OR_RETURN(Value c, Eval(*n.conds[b]));
            take = Truthy(c);
          }
          if (take) {
            MCC_RETURN_IF_ERROR(Exec(n.branches[b]));
            break;
          }
        }
        break;
      case Node::Type::kFor: {
        MCC_ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
        List items;
        if (seq.is(Kind::kList)) {
          items = *seq.list;
        } else if (seq.is(Kind::kDict)) {
          for (const auto& kv : *seq.dict)
            items.push_back(Value::Str(kv.first));
        } else if (seq.is(Kind::kString)) {
          for (char c : seq.str())
            items.push_back(Value::Str(std::string(1, c)));
        } else if (seq.is(Kind::kUndefined)) {
          // Jinja iterates an undefined value as empty.
        } else {
          return Fail(*n.expr,
                      absl::StrCat("cannot loop over a ", KindName(seq.kind)));
        }
        const int64_t len = static_cast<int64_t>(items.size());
        for (int64_t i = 0; i < len; ++i) {
          std::map<std::string, Value> scope;
          scope[n.text] = items[i];
          scope["loop"] = Value::MakeDict({
              {"index0", Value::Int(i)},
              {"index", Value::Int(i + 1)},
              {"revindex0", Value::Int(len - 1 - i)},
              {"revindex", Value::Int(len - i)},
              {"first", Value::Bool(i == 0)},
              {"last", Value::Bool(i == len - 1)},
              {"length", Value::Int(len)},
          });
          scopes_.push_back(std::move(scope));
          const absl::Status s = Exec(n.branches[0]);
          scopes_.pop_back();
          MCC_RETURN_IF_ERROR(s);
        }
        if (len == 0 && n.branches.size() > 1) {
          MCC_RETURN_IF_ERROR(Exec(n.branches[1]));
        }
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Renderer::Repr(const Expr& e, const Value& v, bool json,
                            std::string* out, int indent, int level) {
  // Before each item of a container, and before its closing bracket.
  auto newline = [&](int at) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * at, ' ');
  };
  MCC_RETURN_IF_ERROR(Charge(&e, 1));
  if (static_cast<int64_t>(out->size()) > p_.limits.max_output_bytes) {
    return Fail(e, absl::StrCat("a string longer than ",
                                p_.limits.max_output_bytes, " bytes"));
  }
  switch (v.kind) {
    case Kind::kUndefined:
      if (json) return Fail(e, "tojson of an undefined value");
      return absl::OkStatus();
    case Kind::kNone:
      out->append(json ? "null" : "None");
      return absl::OkStatus();
    case Kind::kBool:
      out->append(json ? (v.b ? "true" : "false") : (v.b ? "True" : "False"));
      return absl::OkStatus();
    case Kind::kInt:
      absl::StrAppend(out, v.i);
      return absl::OkStatus();
    case Kind::kString: {
      MCC_RETURN_IF_ERROR(Charge(&e, static_cast<int64_t>(v.s->size()) / 16));
      const char q = json ? '"' : '\'';
      out->push_back(q);
      for (char c : v.str()) {
        if (c == q || c == '\\') {
          out->push_back('\\');
          out->push_back(c);
        } else if (c == '\n') {
          out->append("\\n");
        } else if (c == '\t') {
          out->append("\\t");
        } else if (c == '\r') {
          out->append("\\r");
        } else if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(
              out, json ? "\\u00" : "\\x",
              absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out->push_back(c);
        }
      }
      out->push_back(q);
      return absl::OkStatus();
    }
    case Kind::kList:
      out->push_back('[');
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i > 0) out->append(indent >= 0 ? "," : ", ");
        newline(level + 1);
        MCC_RETURN_IF_ERROR(
            Repr(e, (*v.list)[i], json, out, indent, level + 1));
      }
      if (!v.list->empty()) newline(level);
      out->push_back(']');
      return absl::OkStatus();
    case Kind::kDict:
      out->push_back('{');
      for (size_t i = 0; i < v.dict->size(); ++i) {
        if (i > 0) out->append(indent >= 0 ? "," : ", ");
        newline(level + 1);
        MCC_RETURN_IF_ERROR(Repr(e, Value::Str((*v.dict)[i].first), json, out));
        out->append(": ");
        MCC_RETURN_IF_ERROR(
            Repr(e, (*v.dict)[i].second, json, out, indent, level + 1));
      }
      if (!v.dict->empty()) newline(level);
      out->push_back('}');
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Renderer::ToString(const Expr& e, const Value& v) {
  if (v.is(Kind::kString)) return v.str();
  std::string out;
  MCC_RETURN_IF_ERROR(Repr(e, v, /*json=*/false, &out));
  return out;
}

absl::StatusOr<bool> Renderer::Equal(const Expr& e, const Value& a,
                                     const Value& b) {
  MCC_RETURN_IF_ERROR(Charge(&e, 1));
  const bool an = a.is(Kind::kInt) || a.is(Kind::kBool);
  const bool bn = b.is(Kind::kInt) || b.is(Kind::kBool);
  if (an && bn) {
    return (a.is(Kind::kBool) ? int64_t{a.b} : a.i) ==
           (b.is(Kind::kBool) ? int64_t{b.b} : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      MCC_RETURN_IF_ERROR(Charge(&e, static_cast<int64_t>(a.s->size()) / 16));
      return a.str() == b.str();
    case Kind::kList: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        MCC_ASSIGN_OR_RETURN(bool eq, Equal(e, (*a.list)[i], (*b.list)[i]));
        if (!eq) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, va] : *a.dict) {
        const Value* vb = DictFind(*b.dict, k);
        if (vb == nullptr) return false;
        MCC_ASSIGN_OR_RETURN(bool eq, Equal(e, va, *vb));
        if (!eq) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

absl::StatusOr<Value> Renderer::Attr(const Expr& e, const Value& v,
                                     const std::string& name) {
  if (v.is(Kind::kUndefined)) {
    return Fail(e, absl::StrCat("'", name, "' of an undefined value"));
  }
  if (v.is(Kind::kDict)) {
    const Value* f = DictFind(*v.dict, name);
    return f ? *f : Value();
  }
  return Value();  // Jinja: a missing attribute is undefined.
}

absl::StatusOr<Value> Renderer::Index(const Expr& e, const Value& v,
                                      const Value& k) {
  if (v.is(Kind::kUndefined)) return Fail(e, "indexing an undefined value");
  if (v.is(Kind::kDict)) {
    if (!k.is(Kind::kString)) return Value();
    const Value* f = DictFind(*v.dict, k.str());
    return f ? *f : Value();
  }
  if (v.is(Kind::kList) || v.is(Kind::kString)) {
    if (!k.is(Kind::kInt)) {
      return Fail(e, absl::StrCat("indexing a ", KindName(v.kind), " with a ",
                                  KindName(k.kind)));
    }
    const int64_t n = v.is(Kind::kList) ? v.list->size() : v.s->size();
    int64_t i = k.i;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();  // undefined, as Jinja
    if (v.is(Kind::kList)) return (*v.list)[i];
    return Value::Str(std::string(1, v.str()[i]));
  }
  return Value();
}

absl::StatusOr<Value> Renderer::Eval(const Expr& e) {
  MCC_RETURN_IF_ERROR(Charge(&e, 1));
  switch (e.op) {
    case Expr::Op::kLiteral:
      return e.value;
    case Expr::Op::kName: {
      const Value* v = Lookup(e.name);
      return v ? *v : Value();
    }
    case Expr::Op::kAttr: {
      MCC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      return Attr(e, v, e.name);
    }
    case Expr::Op::kIndex: {
      MCC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      MCC_ASSIGN_OR_RETURN(Value k, Eval(*e.args[1]));
      return Index(e, v, k);
    }
    case Expr::Op::kSlice: {
      MCC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      int64_t parts[3] = {0, 0, 1};
      bool given[3] = {false, false, false};
      for (int i = 0; i < 3; ++i) {
        if (e.args[i + 1] == nullptr) continue;
        MCC_ASSIGN_OR_RETURN(Value p, Eval(*e.args[i + 1]));
        if (p.is(Kind::kNone)) continue;
        if (!p.is(Kind::kInt))
          return Fail(e, "a slice bound that is not an integer");
        parts[i] = p.i;
        given[i] = true;
      }
      if (!v.is(Kind::kList) && !v.is(Kind::kString)) {
        return Fail(e, absl::StrCat("slicing a ", KindName(v.kind)));
      }
      const int64_t n = v.is(Kind::kList) ? v.list->size() : v.s->size();
      const int64_t step = parts[2];
      if (step == 0) return Fail(e, "a slice step of 0");
      auto clamp = [&](int64_t x, bool is_given, int64_t dflt) {
        if (!is_given) return dflt;
        if (x < 0) x += n;
        if (step > 0) return std::clamp<int64_t>(x, 0, n);
        return std::clamp<int64_t>(x, -1, n - 1);
      };
      const int64_t start = clamp(parts[0], given[0], step > 0 ? 0 : n - 1);
      const int64_t stop = clamp(parts[1], given[1], step > 0 ? n : -1);
      List items;
      std::string chars;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        MCC_RETURN_IF_ERROR(Charge(&e, 1));
        if (v.is(Kind::kList)) {
          items.push_back((*v.list)[i]);
        } else {
          chars.push_back(v.str()[i]);
        }
      }
      if (v.is(Kind::kList)) return Value::MakeList(std::move(items));
      return NewString(e, std::move(chars));
    }
    case Expr::Op::kCall:
      return Call(e);
    case Expr::Op::kFilter: {
      MCC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      std::vector<Value> args;
      for (size_t i = 1; i < e.args.size(); ++i) {
        MCC_ASSIGN_OR_RETURN(Value a, Eval(*e.args[i]));
        args.push_back(std::move(a));
      }
      std::map<std::string, Value> kwargs;
      for (const auto& [name, x] : e.kwargs) {
        MCC_ASSIGN_OR_RETURN(kwargs[name], Eval(*x));
      }
      return Filter(e, v, kwargs, args);
    }
    case Expr::Op::kTest: {
      MCC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      std::vector<Value> args;
      for (size_t i = 1; i < e.args.size(); ++i) {
        MCC_ASSIGN_OR_RETURN(Value a, Eval(*e.args[i]));
        args.push_back(std::move(a));
      }
      MCC_ASSIGN_OR_RETURN(bool r, Test(e, e.name, v, args));
      return Value::Bool(r != e.negate);
    }
    case Expr::Op::kNot: {
      MCC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      return Value::Bool(!Truthy(v));
    }
    case Expr::Op::kNeg: {
      MCC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      if (!v.is(Kind::kInt)) {
        return Fail(e, absl::StrCat("'-' of a ", KindName(v.kind)));
      }
      if (v.i == INT64_MIN) return Fail(e, "integer overflow");
      return Value::Int(-v.i);
    }
    case Expr::Op::kAnd: {
      MCC_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      if (!Truthy(a)) return a;
      return Eval(*e.args[1]);
    }
    case Expr::Op::kOr: {
      MCC_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      if (Truthy(a)) return a;
      return Eval(*e.args[1]);
    }
    case Expr::Op::kTernary: {
      MCC_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
      if (Truthy(c)) return Eval(*e.args[0]);
      if (e.args[2] == nullptr) return Value();
      return Eval(*e.args[2]);
    }
    case Expr::Op::kBinary: {
      MCC_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      MCC_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
      return Binary(e, a, b);
    }
    case Expr::Op::kList: {
      List items;
      for (const ExprPtr& a : e.args) {
        MCC_ASSIGN_OR_RETURN(Value v, Eval(*a));
        items.push_back(std::move(v));
      }
      Value l = Value::MakeList(std::move(items));
      if (l.depth > 4 * p_.limits.max_depth)
        return Fail(e, "lists nested too deep");
      return l;
    }
    case Expr::Op::kDict: {
      Dict items;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        MCC_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
        MCC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
        if (!k.is(Kind::kString))
          return Fail(e, "a dict key that is not a string");
        bool replaced = false;
        for (auto& kv : items) {
          if (kv.first == k.str()) {
            kv.second = v;
            replaced = true;
          }
        }
        if (!replaced) items.emplace_back(k.str(), std::move(v));
      }
      Value d = Value::MakeDict(std::move(items));
      if (d.depth > 4 * p_.limits.max_depth)
        return Fail(e, "dicts nested too deep");
      return d;
    }
  }
  return Fail(e, "unknown expression");
}

absl::StatusOr<Value> Renderer::Binary(const Expr& e, const Value& a,
                                       const Value& b) {
  const std::string& op = e.name;
  if (op == "==" || op == "!=") {
    MCC_ASSIGN_OR_RETURN(bool eq, Equal(e, a, b));
    return Value::Bool(eq == (op == "=="));
  }
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is(Kind::kString)) {
      if (!a.is(Kind::kString)) {
        return Fail(e, absl::StrCat("'in' a string needs a string, not a ",
                                    KindName(a.kind)));
      }
      MCC_RETURN_IF_ERROR(Charge(&e, static_cast<int64_t>(b.s->size()) / 16));
      found = absl::StrContains(b.str(), a.str());
    } else if (b.is(Kind::kList)) {
      for (const Value& x : *b.list) {
        MCC_ASSIGN_OR_RETURN(bool eq, Equal(e, a, x));
        if (eq) {
          found = true;
          break;
        }
      }
    } else if (b.is(Kind::kDict)) {
      found = a.is(Kind::kString) && DictFind(*b.dict, a.str()) != nullptr;
    } else {
      return Fail(e, absl::StrCat("'in' a ", KindName(b.kind)));
    }
    return Value::Bool(found == (op == "in"));
  }
  if (op == "~") {
    MCC_ASSIGN_OR_RETURN(std::string x, ToString(e, a));
    MCC_ASSIGN_OR_RETURN(std::string y, ToString(e, b));
    return NewString(e, x + y);
  }
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    int c = 0;
    if (a.is(Kind::kInt) && b.is(Kind::kInt)) {
      c = a.i < b.i ? -1 : a.i > b.i ? 1 : 0;
    } else if (a.is(Kind::kString) && b.is(Kind::kString)) {
      c = a.str().compare(b.str());
    } else {
      return Fail(e, absl::StrCat("'", op, "' between a ", KindName(a.kind),
                                  " and a ", KindName(b.kind)));
    }
    const bool r = op == "<"    ? c < 0
                   : op == ">"  ? c > 0
                   : op == "<=" ? c <= 0
                                : c >= 0;
    return Value::Bool(r);
  }
  if (op == "+" && a.is(Kind::kString) && b.is(Kind::kString)) {
    return NewString(e, a.str() + b.str());
  }
  if (op == "+" && a.is(Kind::kList) && b.is(Kind::kList)) {
    if (static_cast<int64_t>(a.list->size() + b.list->size()) >
        p_.limits.max_list_items) {
      return Fail(e, "a list longer than the limit");
    }
    MCC_RETURN_IF_ERROR(
        Charge(&e, static_cast<int64_t>(a.list->size() + b.list->size())));
    List l = *a.list;
    l.insert(l.end(), b.list->begin(), b.list->end());
    return Value::MakeList(std::move(l));
  }
  if (a.is(Kind::kInt) && b.is(Kind::kInt)) {
    int64_t r = 0;
    if (op == "+") {
      if (__builtin_add_overflow(a.i, b.i, &r))
        return Fail(e, "integer overflow");
    } else if (op == "-") {
      if (__builtin_sub_overflow(a.i, b.i, &r))
        return Fail(e, "integer overflow");
    } else if (op == "*") {
      if (__builtin_mul_overflow(a.i, b.i, &r))
        return Fail(e, "integer overflow");
    } else if (op == "//" || op == "%") {
      if (b.i == 0) return Fail(e, "division by zero");
      if (a.i == INT64_MIN && b.i == -1) return Fail(e, "integer overflow");
      // Python's floor division and modulo.
      int64_t q = a.i / b.i, m = a.i % b.i;
      if (m != 0 && ((m < 0) != (b.i < 0))) {
        --q;
        m += b.i;
      }
      r = op == "//" ? q : m;
    }
    return Value::Int(r);
  }
  return Fail(e, absl::StrCat("'", op, "' between a ", KindName(a.kind),
                              " and a ", KindName(b.kind)));
}

std::string Capitalized(absl::string_view s) {
  std::string r = absl::AsciiStrToLower(s);
  if (!r.empty()) r[0] = absl::ascii_toupper(r[0]);
  return r;
}

std::string Titled(absl::string_view s) {
  std::string r(s);
  bool start = true;
  for (char& c : r) {
    if (absl::ascii_isalpha(c)) {
      c = start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
      start = false;
    } else {
      start = true;
    }
  }
  return r;
}

absl::StatusOr<Value> Renderer::Filter(
    const Expr& e, const Value& v, const std::map<std::string, Value>& kwargs,
    const std::vector<Value>& args) {
  const std::string& f = e.name;
  for (const auto& kw : kwargs) {
    if (!(f == "tojson" && kw.first == "indent")) {
      return Unsupported(p_.source, e.pos,
                         absl::StrCat("the keyword argument '", kw.first,
                                      "' of the filter '", f, "'"));
    }
  }
  auto need_string = [&]() -> absl::Status {
    if (!v.is(Kind::kString)) {
      return Fail(e, absl::StrCat("filter '", f, "' of a ", KindName(v.kind)));
    }
    return absl::OkStatus();
  };
  if (f == "trim") {
    MCC_RETURN_IF_ERROR(need_string());
    return NewString(e, std::string(absl::StripAsciiWhitespace(v.str())));
  }
  if (f == "length" || f == "count") {
    if (v.is(Kind::kString)) return Value::Int(v.s->size());
    if (v.is(Kind::kList)) return Value::Int(v.list->size());
    if (v.is(Kind::kDict)) return Value::Int(v.dict->size());
    if (v.is(Kind::kUndefined)) return Value::Int(0);
    return Fail(e, absl::StrCat("filter '", f, "' of a ", KindName(v.kind)));
  }
  if (f == "upper" || f == "lower" || f == "capitalize" || f == "title") {
    MCC_RETURN_IF_ERROR(need_string());
    if (f == "upper") return NewString(e, absl::AsciiStrToUpper(v.str()));
    if (f == "lower") return NewString(e, absl::AsciiStrToLower(v.str()));
    if (f == "capitalize") return NewString(e, Capitalized(v.str()));
    return NewString(e, Titled(v.str()));
  }
  if (f == "string") {
    MCC_ASSIGN_OR_RETURN(std::string s, ToString(e, v));
    return NewString(e, std::move(s));
  }
  if (f == "int") {
    if (v.is(Kind::kInt)) return v;
    if (v.is(Kind::kBool)) return Value::Int(v.b);
    int64_t n = 0;
    if (v.is(Kind::kString) &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(v.str()), &n)) {
      return Value::Int(n);
    }
    return Value::Int(0);
  }
  if (f == "first" || f == "last") {
    if (v.is(Kind::kList)) {
      if (v.list->empty()) return Value();
      return f == "first" ? v.list->front() : v.list->back();
    }
    if (v.is(Kind::kString)) {
      if (v.s->empty()) return Value();
      return Value::Str(
          std::string(1, f == "first" ? v.str().front() : v.str().back()));
    }
    return Fail(e, absl::StrCat("filter '", f, "' of a ", KindName(v.kind)));
  }
  if (f == "default" || f == "d") {
    if (args.size() > 1)
      return Unsupported(p_.source, e.pos, "default's second argument");
    if (!v.is(Kind::kUndefined)) return v;
    return args.empty() ? Value::Str("") : args[0];
  }
  if (f == "join") {
    if (!v.is(Kind::kList)) {
      return Fail(e, absl::StrCat("filter 'join' of a ", KindName(v.kind)));
    }
    std::string sep;
    if (!args.empty()) {
      MCC_ASSIGN_OR_RETURN(sep, ToString(e, args[0]));
    }
    std::string r;
    for (size_t i = 0; i < v.list->size(); ++i) {
      if (i > 0) r += sep;
      MCC_ASSIGN_OR_RETURN(std::string s, ToString(e, (*v.list)[i]));
      r += s;
      if (static_cast<int64_t>(r.size()) > p_.limits.max_output_bytes) {
        return Fail(e, "a string longer than the limit");
      }
    }
    return NewString(e, std::move(r));
  }
  if (f == "reverse") {
    if (v.is(Kind::kString)) {
      return NewString(e, std::string(v.str().rbegin(), v.str().rend()));
    }
    if (v.is(Kind::kList)) {
      MCC_RETURN_IF_ERROR(Charge(&e, static_cast<int64_t>(v.list->size())));
      return Value::MakeList(List(v.list->rbegin(), v.list->rend()));
    }
    return Fail(e, absl::StrCat("filter 'reverse' of a ", KindName(v.kind)));
  }
  if (f == "tojson") {
    if (!args.empty()) {
      return Unsupported(p_.source, e.pos, "tojson's positional arguments");
    }
    int indent = -1;
    if (auto it = kwargs.find("indent"); it != kwargs.end()) {
      if (!it->second.is(Kind::kInt) || it->second.i < 0 || it->second.i > 16) {
        return Fail(e, "tojson's indent must be an integer in [0, 16]");
      }
      indent = static_cast<int>(it->second.i);
    }
    std::string out;
    MCC_RETURN_IF_ERROR(Repr(e, v, /*json=*/true, &out, indent));
    return NewString(e, std::move(out));
  }
  if (f == "select" || f == "reject") {
    if (!v.is(Kind::kList)) {
      return Fail(e, absl::StrCat("filter '", f, "' of a ", KindName(v.kind)));
    }
    if (args.empty() || !args[0].is(Kind::kString)) {
      return Unsupported(p_.source, e.pos,
                         absl::StrCat("'", f, "' without a test name"));
    }
    const std::vector<Value> test_args(args.begin() + 1, args.end());
    List kept;
    for (const Value& x : *v.list) {
      MCC_RETURN_IF_ERROR(Charge(&e, 1));
      MCC_ASSIGN_OR_RETURN(bool pass, Test(e, args[0].str(), x, test_args));
      if (pass == (f == "select")) kept.push_back(x);
    }
    return Value::MakeList(std::move(kept));
  }
  return Unsupported(p_.source, e.pos, absl::StrCat("the filter '", f, "'"));
}

absl::StatusOr<bool> Renderer::Test(const Expr& e, const std::string& t,
                                    const Value& v,
                                    const std::vector<Value>& args) {
  if (t == "equalto" || t == "eq" || t == "==" || t == "ne" || t == "!=") {
    if (args.size() != 1) {
      return Fail(e, absl::StrCat("the test '", t, "' takes one argument"));
    }
    MCC_ASSIGN_OR_RETURN(bool eq, Equal(e, v, args[0]));
    return eq == (t != "ne" && t != "!=");
  }
  if (!args.empty()) {
    return Unsupported(p_.source, e.pos,
                       absl::StrCat("arguments to the test '", t, "'"));
  }
  if (t == "defined") return !v.is(Kind::kUndefined);
  if (t == "undefined") return v.is(Kind::kUndefined);
  if (t == "none") return v.is(Kind::kNone);
  if (t == "string") return v.is(Kind::kString);
  if (t == "number" || t == "integer") return v.is(Kind::kInt);
  if (t == "boolean") return v.is(Kind::kBool);
  if (t == "mapping") return v.is(Kind::kDict);
  if (t == "sequence" || t == "iterable") {
    return v.is(Kind::kList) || v.is(Kind::kString) || v.is(Kind::kDict);
  }
  if (t == "true") return v.is(Kind::kBool) && v.b;
  if (t == "false") return v.is(Kind::kBool) && !v.b;
  if (t == "even" || t == "odd") {
    if (!v.is(Kind::kInt)) {
      return Fail(e, absl::StrCat("test '", t, "' of a ", KindName(v.kind)));
    }
    return (v.i % 2 == 0) == (t == "even");
  }
  return Unsupported(p_.source, e.pos, absl::StrCat("the test '", t, "'"));
}

absl::StatusOr<Value> Renderer::Call(const Expr& e) {
  const Expr& callee = *e.args[0];
  if (!e.kwargs.empty()) {
    return Unsupported(p_.source, e.pos,
                       absl::StrCat("the keyword argument '", e.kwargs[0].first,
                                    "' of a call"));
  }
  std::vector<Value> args;
  for (size_t i = 1; i < e.args.size(); ++i) {
    MCC_ASSIGN_OR_RETURN(Value a, Eval(*e.args[i]));
    args.push_back(std::move(a));
  }
  if (callee.op == Expr::Op::kAttr) {
    MCC_ASSIGN_OR_RETURN(Value self, Eval(*callee.args[0]));
    return Method(e, self, callee.name, args);
  }
  const std::string& fn = callee.name;
  if (fn == "raise_exception") {
    std::string msg = "raise_exception()";
    if (!args.empty()) {
      MCC_ASSIGN_OR_RETURN(msg, ToString(e, args[0]));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("chat template: ", msg, " (raise_exception at ",
                     Where(p_.source, e.pos), ")"));
  }
  if (fn == "strftime_now") {
    // transformers': datetime.now().strftime(format), local time.
    if (args.size() != 1 || !args[0].is(Kind::kString) ||
        args[0].s->size() > 256) {
      return Fail(e, "strftime_now takes one format string");
    }
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[1024];
    const size_t n =
        std::strftime(buf, sizeof(buf), args[0].str().c_str(), &local);
    return NewString(e, std::string(buf, n));
  }
  if (fn == "range") {
    int64_t a = 0, b = 0, step = 1;
    for (const Value& x : args) {
      if (!x.is(Kind::kInt)) return Fail(e, "range() of a non-integer");
    }
    if (args.size() == 1) {
      b = args[0].i;
    } else if (args.size() == 2 || args.size() == 3) {
      a = args[0].i;
      b = args[1].i;
      if (args.size() == 3) step = args[2].i;
    } else {
      return Fail(e, "range() takes 1 to 3 arguments");
    }
    if (step == 0) return Fail(e, "range() step of 0");
    List items;
    for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
      if (static_cast<int64_t>(items.size()) >= p_.limits.max_list_items) {
        return Fail(e, "range() longer than the limit");
      }
      MCC_RETURN_IF_ERROR(Charge(&e, 1));
      items.push_back(Value::Int(i));
      if ((step > 0 && i > INT64_MAX - step) ||
          (step < 0 && i < INT64_MIN - step))
        break;
    }
    return Value::MakeList(std::move(items));
  }
  return Unsupported(p_.source, e.pos, absl::StrCat("the function '", fn, "'"));
}

absl::StatusOr<Value> Renderer::Method(const Expr& e, const Value& self,
                                       const std::string& name,
                                       const std::vector<Value>& args) {
  auto arg_string = [&](size_t i) -> absl::StatusOr<std::string> {
    if (i >= args.size() || !args[i].is(Kind::kString)) {
      return Fail(e, absl::StrCat("'", name, "' needs a string argument"));
    }
    return args[i].str();
  };
  if (self.is(Kind::kString)) {
    const std::string& s = self.str();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      std::string chars = " \t\n\r\v\f";
      if (!args.empty() && !args[0].is(Kind::kNone)) {
        MCC_ASSIGN_OR_RETURN(chars, arg_string(0));
      }
      size_t b = 0, en = s.size();
      if (name != "rstrip") {
        while (b < en && chars.find(s[b]) != std::string::npos) ++b;
      }
      if (name != "lstrip") {
        while (en > b && chars.find(s[en - 1]) != std::string::npos) --en;
      }
      return NewString(e, s.substr(b, en - b));
    }
    if (name == "upper") return NewString(e, absl::AsciiStrToUpper(s));
    if (name == "lower") return NewString(e, absl::AsciiStrToLower(s));
    if (name == "title") return NewString(e, Titled(s));
    if (name == "capitalize") return NewString(e, Capitalized(s));
    if (name == "startswith" || name == "endswith") {
      MCC_ASSIGN_OR_RETURN(std::string x, arg_string(0));
      return Value::Bool(name == "startswith" ? absl::StartsWith(s, x)
                                              : absl::EndsWith(s, x));
    }
    if (name == "replace") {
      MCC_ASSIGN_OR_RETURN(std::string from, arg_string(0));
      MCC_ASSIGN_OR_RETURN(std::string to, arg_string(1));
      if (from.empty()) return Unsupported(p_.source, e.pos, "replace('')");
      std::string r;
      size_t i = 0;
      while (true) {
        const size_t f = s.find(from, i);
        if (f == std::string::npos) break;
        r.append(s, i, f - i);
        r += to;
        i = f + from.size();
        if (static_cast<int64_t>(r.size()) > p_.limits.max_output_bytes) {
          return Fail(e, "a string longer than the limit");
        }
      }
      r.append(s, i, std::string::npos);
      return NewString(e, std::move(r));
    }
    if (name == "split") {
      List parts;
      std::vector<std::string> pieces;
      if (args.empty() || args[0].is(Kind::kNone)) {
        pieces = absl::StrSplit(s, absl::ByAnyChar(" \t\n\r\v\f"),
                                absl::SkipEmpty());
      } else {
        MCC_ASSIGN_OR_RETURN(std::string sep, arg_string(0));
        if (sep.empty()) return Fail(e, "split() with an empty separator");
        pieces = absl::StrSplit(s, sep);
      }
      MCC_RETURN_IF_ERROR(Charge(&e, static_cast<int64_t>(pieces.size())));
      for (std::string& p : pieces) parts.push_back(Value::Str(std::move(p)));
      return Value::MakeList(std::move(parts));
    }
  }
  if (self.is(Kind::kDict)) {
    if (name == "get") {
      MCC_ASSIGN_OR_RETURN(std::string k, arg_string(0));
      const Value* f = DictFind(*self.dict, k);
      if (f) return *f;
      return args.size() > 1 ? args[1] : Value::None();
    }
    if (name == "keys" || name == "values" || name == "items") {
      MCC_RETURN_IF_ERROR(Charge(&e, static_cast<int64_t>(self.dict->size())));
      List out;
      for (const auto& [k, v] : *self.dict) {
        if (name == "keys") {
          out.push_back(Value::Str(k));
        } else if (name == "values") {
          out.push_back(v);
        } else {
          out.push_back(Value::MakeList({Value::Str(k), v}));
        }
      }
      return Value::MakeList(std::move(out));
    }
  }
  if (self.is(Kind::kUndefined)) {
    return Fail(e, absl::StrCat("'", name, "' of an undefined value"));
  }
  return Unsupported(
      p_.source, e.pos,
      absl::StrCat("the method '", name, "' of a ", KindName(self.kind)));
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(absl::string_view source,
                                                 ChatTemplateLimits limits) {
  if (static_cast<int64_t>(source.size()) > limits.max_output_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat template: longer than ", limits.max_output_bytes, " bytes"));
  }
  Parser parser(source, limits);
  MCC_ASSIGN_OR_RETURN(Body body, parser.ParseTemplate());
  auto program = std::make_shared<Program>();
  program->body = std::move(body);
  program->limits = limits;
  program->source = std::string(source);
  ChatTemplate t;
  t.program_ = std::move(program);
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(
    const ChatTemplateInputs& inputs) const {
  std::string out;
  Renderer r(*program_, &out);
  MCC_RETURN_IF_ERROR(r.Run(inputs));
  return out;
}

}  // namespace mcc::data
