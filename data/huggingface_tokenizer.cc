#include "data/huggingface_tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/json_document.h"
#include "data/byte_level_bpe.h"
#include "data/unicode_text.h"

namespace mcc::data {

// ------------------------------------------------------------ regex splits

namespace {

constexpr char kGpt2Regex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool IsNewline(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// ASCII lower case, and U+017F (long s), which Unicode case folding maps to
// 's' as (?i) does.
uint32_t FoldCase(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp == 0x17F) return 's';
  return cp;
}

// Llama 3's and Qwen 2's pattern, alternative by alternative, from code
// points cps[i..n) of classes cls; returns the end of the match at i.
size_t MatchLlama3(const std::vector<uint32_t>& cps,
                   const std::vector<CharClass>& cls, size_t i,
                   size_t max_digits) {
  const size_t n = cps.size();
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (cps[i] == '\'' && i + 1 < n) {
    const uint32_t a = FoldCase(cps[i + 1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      const uint32_t b = FoldCase(cps[i + 2]);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
          (a == 'l' && b == 'l')) {
        return i + 3;
      }
    }
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = i;
    if (cls[j] != kLetter && cls[j] != kNumber && !IsNewline(cps[j]) &&
        j + 1 < n && cls[j + 1] == kLetter) {
      ++j;
    }
    if (cls[j] == kLetter) {
      while (j < n && cls[j] == kLetter) ++j;
      return j;
    }
  }
  // \p{N}{1,max_digits}
  if (cls[i] == kNumber) {
    size_t j = i;
    while (j < n && j - i < max_digits && cls[j] == kNumber) ++j;
    return j;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  {
    size_t j = i;
    if (cps[j] == ' ' && j + 1 < n && cls[j + 1] == kOther) ++j;
    if (cls[j] == kOther) {
      while (j < n && cls[j] == kOther) ++j;
      while (j < n && IsNewline(cps[j])) ++j;
      return j;
    }
  }
  // Whitespace from here on: the run [i, r).
  size_t r = i;
  while (r < n && cls[r] == kSpace) ++r;
  // \s*[\r\n]+ : up to and including the run's last newline.
  for (size_t p = r; p > i; --p) {
    if (IsNewline(cps[p - 1])) return p;
  }
  // \s+(?!\S) then \s+
  if (r == n) return n;
  if (r - i >= 2) return r - 1;
  return i + 1;
}

}  // namespace

std::vector<absl::string_view> SplitByPattern(SplitPattern pattern,
                                              absl::string_view text) {
  if (pattern == SplitPattern::kGpt2) return GPT2PreTokenize(text);
  const ClassifiedText chars = ClassifyText(text);
  const size_t max_digits = pattern == SplitPattern::kLlama3 ? 3 : 1;
  std::vector<absl::string_view> pieces;
  for (size_t i = 0; i < chars.cps.size();) {
    const size_t j = MatchLlama3(chars.cps, chars.cls, i, max_digits);
    pieces.push_back(text.substr(chars.offs[i], chars.offs[j] - chars.offs[i]));
    i = j;
  }
  return pieces;
}

// ---------------------------------------------------------------- the model

namespace {

struct PreTokenizeStep {
  bool byte_level = false;  // else a Split
  SplitPattern pattern = SplitPattern::kGpt2;
  bool use_regex = true;  // ByteLevel: split by GPT-2's regex
  bool add_prefix_space = false;
};

struct HfVocab {
  // Bytes of each id (an added token's content); `present` marks ids that
  // exist.
  std::vector<std::string> id_to_bytes;
  std::vector<bool> present;
  absl::flat_hash_map<std::string, int32_t> bytes_to_id;  // model.vocab
  int32_t byte_id[256];
  // (left id << 32 | right id) -> (rank, merged id)
  BpeMerges merges;
  bool ignore_merges = false;
  std::vector<PreTokenizeStep> steps;
  // Added tokens by first byte, longest first.
  std::array<std::vector<std::pair<std::string, int32_t>>, 256> added;
  int32_t eod = -1;
};

class HuggingFaceTokenizer : public Tokenizer {
 public:
  explicit HuggingFaceTokenizer(std::shared_ptr<const HfVocab> v)
      : v_(std::move(v)) {}
  std::string name() const override { return "HuggingFaceTokenizer"; }
  int64_t vocab_size() const override { return v_->id_to_bytes.size(); }
  int64_t eod() const override { return v_->eod; }

  void Encode(absl::string_view text, std::vector<int32_t>* out) override {
    size_t start = 0;
    for (size_t i = 0; i < text.size();) {
      const auto& candidates = v_->added[static_cast<unsigned char>(text[i])];
      int32_t id = -1;
      size_t len = 0;
      for (const auto& [content, cid] : candidates) {
        if (text.substr(i, content.size()) == content) {
          id = cid;
          len = content.size();
          break;
        }
      }
      if (id < 0) {
        ++i;
        continue;
      }
      EncodeSegment(text.substr(start, i - start), out);
      out->push_back(id);
      i += len;
      start = i;
    }
    EncodeSegment(text.substr(start), out);
  }

  absl::StatusOr<std::string> Decode(
      absl::Span<const int64_t> ids) const override {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t id = ids[i];
      if (id < 0 || id >= vocab_size() || !v_->present[id]) {
        return absl::OutOfRangeError(
            absl::StrCat("HuggingFaceTokenizer: token ", id, " at position ", i,
                         " is not in the vocabulary of ", vocab_size()));
      }
      s += v_->id_to_bytes[id];
    }
    return s;
  }

  std::unique_ptr<Tokenizer> Clone() const override {
    return std::make_unique<HuggingFaceTokenizer>(v_);
  }

 private:
  // Pre-tokenizes a stretch without added tokens and BPE-encodes its pieces.
  void EncodeSegment(absl::string_view segment, std::vector<int32_t>* out) {
    if (segment.empty()) return;
    std::vector<std::string> pieces = {std::string(segment)};
    std::vector<std::string> next;
    for (const PreTokenizeStep& step : v_->steps) {
      next.clear();
      for (std::string& piece : pieces) {
        if (step.byte_level && step.add_prefix_space &&
            (piece.empty() || piece[0] != ' ')) {
          piece.insert(0, 1, ' ');
        }
        if (step.byte_level && !step.use_regex) {
          next.push_back(std::move(piece));
          continue;
        }
        const SplitPattern p =
            step.byte_level ? SplitPattern::kGpt2 : step.pattern;
        for (absl::string_view s : SplitByPattern(p, piece)) {
          next.emplace_back(s);
        }
      }
      pieces.swap(next);
    }
    for (const std::string& piece : pieces) {
      auto it = cache_.find(piece);
      if (it == cache_.end()) {
        if (cache_.size() > (1 << 20)) cache_.clear();
        it = cache_.emplace(piece, Bpe(piece)).first;
      }
      out->insert(out->end(), it->second.begin(), it->second.end());
    }
  }

  std::vector<int32_t> Bpe(absl::string_view piece) const {
    if (v_->ignore_merges) {
      auto whole = v_->bytes_to_id.find(piece);
      if (whole != v_->bytes_to_id.end()) return {whole->second};
    }
    return ByteLevelBpe(piece, v_->byte_id, v_->merges);
  }

  std::shared_ptr<const HfVocab> v_;
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;
};

// The value at `key` of object `o`, or null when absent.
const JsonDocument* Member(const JsonDocument& o, const char* key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

bool IsTrue(const JsonDocument& o, const char* key) {
  const JsonDocument* v = Member(o, key);
  return v != nullptr && v->is_boolean() && v->get<bool>();
}

bool BoolOr(const JsonDocument& o, const char* key, bool fallback) {
  const JsonDocument* v = Member(o, key);
  return v != nullptr && v->is_boolean() ? v->get<bool>() : fallback;
}

std::string TypeOf(const JsonDocument& o) {
  const JsonDocument* t = Member(o, "type");
  return t != nullptr && t->is_string() ? t->get<std::string>() : "";
}

// Appends the steps of a pre_tokenizer object to *steps.
absl::Status ParsePreTokenizer(const JsonDocument& p, const std::string& where,
                               std::vector<PreTokenizeStep>* steps) {
  const std::string type = TypeOf(p);
  if (type == "Sequence") {
    const JsonDocument* list = Member(p, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a Sequence without a pretokenizers list"));
    }
    for (size_t i = 0; i < list->size(); ++i) {
      absl::Status s = ParsePreTokenizer(
          (*list)[i], absl::StrCat(where, "[", i, "]"), steps);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  PreTokenizeStep step;
  if (type == "ByteLevel") {
    step.byte_level = true;
    step.use_regex = BoolOr(p, "use_regex", true);
    step.add_prefix_space = BoolOr(p, "add_prefix_space", false);
    steps->push_back(step);
    return absl::OkStatus();
  }
  if (type == "Split") {
    const JsonDocument* pattern = Member(p, "pattern");
    const JsonDocument* regex =
        pattern != nullptr ? Member(*pattern, "Regex") : nullptr;
    if (regex == nullptr || !regex->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": a Split without a {\"Regex\": ...} pattern is not "
                       "supported"));
    }
    const std::string re = regex->get<std::string>();
    if (re == kGpt2Regex) {
      step.pattern = SplitPattern::kGpt2;
    } else if (re == kLlama3Regex) {
      step.pattern = SplitPattern::kLlama3;
    } else if (re == kQwen2Regex) {
      step.pattern = SplitPattern::kQwen2;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": Split regex ", JsonDocument(re).dump(),
          " is not one this tokenizer implements (GPT-2's, Llama 3's or "
          "Qwen 2's); refusing rather than splitting the text differently"));
    }
    const JsonDocument* behavior = Member(p, "behavior");
    if (behavior == nullptr || !behavior->is_string() ||
        behavior->get<std::string>() != "Isolated" || IsTrue(p, "invert")) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          ": only Split with behavior Isolated and invert false is "
          "supported"));
    }
    steps->push_back(step);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": pre-tokenizer type \"", type,
                   "\" is not supported (ByteLevel, Split, Sequence)"));
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::NotFoundError(absl::StrCat("--tokenizer-model ",
                                            path.empty() ? "(empty)" : path,
                                            ": cannot open"));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeHuggingFaceTokenizerFromText(
    absl::string_view json_text, const std::string& label,
    const std::string& eos_token) {
  auto error = [&label](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer-model ", label, ": ",
                     std::forward<decltype(parts)>(parts)...));
  };
  absl::StatusOr<JsonDocument> doc = ParseJsonDocument(json_text);
  if (!doc.ok()) return error(doc.status().message());
  if (!doc->is_object()) return error("not a JSON object");
  const JsonDocument* model = Member(*doc, "model");
  if (model == nullptr || !model->is_object()) {
    return error("no \"model\" object");
  }
  const std::string model_type = TypeOf(*model);
  if (!model_type.empty() && model_type != "BPE") {
    return error("model.type \"", model_type,
                 "\" is not supported (only byte-level BPE)");
  }
  if (IsTrue(*model, "byte_fallback")) {
    return error(
        "model.byte_fallback is not supported (byte-level BPE "
        "covers every byte)");
  }
  if (const JsonDocument* d = Member(*model, "dropout");
      d != nullptr && (!d->is_number() || d->get<double>() != 0)) {
    return error("model.dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const JsonDocument* v = Member(*model, key);
    if (v != nullptr && (!v->is_string() || !v->get<std::string>().empty())) {
      return error("model.", key, " is not supported");
    }
  }
  if (const JsonDocument* n = Member(*doc, "normalizer"); n != nullptr) {
    return error("normalizer \"", TypeOf(*n),
                 "\" is not supported (only null)");
  }

  auto v = std::make_shared<HfVocab>();
  v->ignore_merges = IsTrue(*model, "ignore_merges");
  const JsonDocument* pre = Member(*doc, "pre_tokenizer");
  if (pre == nullptr)
    return error("no pre_tokenizer (byte-level BPE needs ByteLevel)");
  if (absl::Status s = ParsePreTokenizer(*pre, "pre_tokenizer", &v->steps);
      !s.ok()) {
    return error(s.message());
  }
  for (size_t i = 0; i < v->steps.size(); ++i) {
    if (v->steps[i].byte_level != (i + 1 == v->steps.size())) {
      return error(
          "pre_tokenizer: exactly one ByteLevel step, the last, is "
          "supported");
    }
  }

  constexpr uint64_t kMaxId = 1u << 21;  // bounds what a file makes us allocate
  auto put = [&](uint64_t id, std::string bytes) {
    if (id >= v->id_to_bytes.size()) {
      v->id_to_bytes.resize(id + 1);
      v->present.resize(id + 1, false);
    }
    v->id_to_bytes[id] = std::move(bytes);
    v->present[id] = true;
  };

  // added_tokens first: their content may sit in model.vocab too (GPT-2's
  // <|endoftext|>), outside the byte-level alphabet.
  absl::flat_hash_map<std::string, int32_t> added_ids;
  if (const JsonDocument* added = Member(*doc, "added_tokens");
      added != nullptr) {
    if (!added->is_array()) return error("added_tokens is not a list");
    for (size_t i = 0; i < added->size(); ++i) {
      const JsonDocument& t = (*added)[i];
      const JsonDocument* id = Member(t, "id");
      const JsonDocument* content = Member(t, "content");
      if (id == nullptr || !id->is_number_unsigned() ||
          id->get<uint64_t>() >= kMaxId || content == nullptr ||
          !content->is_string() || content->get<std::string>().empty()) {
        return error("added_tokens[", i,
                     "] needs an id below 2^21 and a non-empty content");
      }
      for (const char* key : {"lstrip", "rstrip", "single_word"}) {
        if (IsTrue(t, key)) {
          return error("added_tokens[", i, "] (", content->dump(), "): ", key,
                       " is not supported");
        }
      }
      const std::string c = content->get<std::string>();
      const uint64_t n = id->get<uint64_t>();
      if (n < v->present.size() && v->present[n] && v->id_to_bytes[n] != c) {
        // One id, two texts: decoding could give back only one of them.
        return error("added_tokens[", i, "] (", content->dump(), "): id ", n,
                     " is already ", JsonDocument(v->id_to_bytes[n]).dump());
      }
      put(n, c);
      added_ids[c] = static_cast<int32_t>(id->get<uint64_t>());
    }
  }

  const JsonDocument* vocab = Member(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return error("model.vocab is not an object of token -> id");
  }
  std::string bytes;
  for (const auto& [key, value] : vocab->items()) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() >= kMaxId) {
      return error("model.vocab: the id of ", JsonDocument(key).dump(),
                   " is not an integer in [0, 2^21): ", value.dump());
    }
    const uint64_t id = value.get<uint64_t>();
    if (!ByteLevelToBytes(key, &bytes)) {
      auto a = added_ids.find(key);
      if (a == added_ids.end() || a->second != static_cast<int32_t>(id)) {
        return error("model.vocab: token ", JsonDocument(key).dump(),
                     " is not in the byte-level alphabet");
      }
      continue;  // an added token, already placed
    }
    if (id < v->present.size() && v->present[id] &&
        !(added_ids.count(key) && added_ids[key] == static_cast<int32_t>(id))) {
      return error("model.vocab: id ", id, " is given twice");
    }
    if (!v->bytes_to_id.emplace(bytes, static_cast<int32_t>(id)).second) {
      return error("model.vocab: token ", JsonDocument(key).dump(),
                   " has the bytes of another token");
    }
    put(id, bytes);
  }
  if (const int b = FillByteIds(v->bytes_to_id, v->byte_id); b >= 0) {
    return error("model.vocab has no token for byte ", b,
                 " (byte-level BPE needs all 256)");
  }

  const JsonDocument* merges = Member(*model, "merges");
  if (merges == nullptr || !merges->is_array()) {
    return error("model.merges is not a list");
  }
  std::string left, right;
  for (size_t i = 0; i < merges->size(); ++i) {
    const JsonDocument& m = (*merges)[i];
    bool ok = false;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      ok = sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
           s.find(' ', sp + 1) == std::string::npos &&
           ByteLevelToBytes(absl::string_view(s).substr(0, sp), &left) &&
           ByteLevelToBytes(absl::string_view(s).substr(sp + 1), &right);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() &&
               m[1].is_string()) {
      ok = ByteLevelToBytes(m[0].get<std::string>(), &left) &&
           ByteLevelToBytes(m[1].get<std::string>(), &right);
    }
    if (!ok) {
      return error("model.merges[", i, "] ", m.dump(),
                   " is not two byte-level tokens (\"a b\" or [\"a\", \"b\"])");
    }
    auto l = v->bytes_to_id.find(left);
    auto r = v->bytes_to_id.find(right);
    auto joined = v->bytes_to_id.find(left + right);
    if (l == v->bytes_to_id.end() || r == v->bytes_to_id.end() ||
        joined == v->bytes_to_id.end()) {
      return error("model.merges[", i, "] ", m.dump(),
                   ": the merge or its parts are not in model.vocab");
    }
    // The first (lowest-ranked) of a repeated merge counts, as in the
    // library.
    v->merges.emplace(BpeMergeKey(l->second, r->second),
                      std::make_pair(static_cast<int32_t>(i), joined->second));
  }

  for (const auto& [content, id] : added_ids) {
    v->added[static_cast<unsigned char>(content[0])].emplace_back(content, id);
  }
  for (auto& list : v->added) {
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
      return a.first.size() != b.first.size() ? a.first.size() > b.first.size()
                                              : a.first < b.first;
    });
  }

  auto find_token = [&](const std::string& t) -> int32_t {
    auto a = added_ids.find(t);
    if (a != added_ids.end()) return a->second;
    auto b = ByteLevelToBytes(t, &bytes) ? v->bytes_to_id.find(bytes)
                                         : v->bytes_to_id.end();
    return b != v->bytes_to_id.end() ? b->second : -1;
  };
  if (!eos_token.empty()) {
    v->eod = find_token(eos_token);
    if (v->eod < 0) {
      return error("the eos_token ", JsonDocument(eos_token).dump(),
                   " (tokenizer_config.json) is not a token of this file");
    }
  } else {
    for (const char* t :
         {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"}) {
      v->eod = find_token(t);
      if (v->eod >= 0) break;
    }
    if (v->eod < 0) {
      return error(
          "no end-of-document token: none of <|endoftext|>, "
          "<|end_of_text|>, </s>, <eos>, <|im_end|>, and no "
          "tokenizer_config.json with an eos_token beside it");
    }
  }
  return std::unique_ptr<Tokenizer>(new HuggingFaceTokenizer(std::move(v)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeHuggingFaceTokenizer(
    const std::string& tokenizer_json) {
  absl::StatusOr<std::string> text = ReadTextFile(tokenizer_json);
  if (!text.ok()) return text.status();
  // tokenizer_config.json beside it names the eos token, as the library's
  // AutoTokenizer reads it.
  std::string eos;
  const size_t slash = tokenizer_json.rfind('/');
  const std::string config_path =
      (slash == std::string::npos ? std::string()
                                  : tokenizer_json.substr(0, slash + 1)) +
      "tokenizer_config.json";
  std::ifstream config_file(config_path, std::ios::binary);
  if (config_file) {
    std::stringstream ss;
    ss << config_file.rdbuf();
    absl::StatusOr<JsonDocument> config = ParseJsonDocument(ss.str());
    if (!config.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": ", config.status().message()));
    }
    const JsonDocument* e = Member(*config, "eos_token");
    if (e != nullptr && e->is_object()) e = Member(*e, "content");
    if (e != nullptr && e->is_string()) eos = e->get<std::string>();
  }
  return MakeHuggingFaceTokenizerFromText(*text, tokenizer_json, eos);
}

}  // namespace mcc::data
