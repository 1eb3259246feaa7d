#include "data/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/json_document.h"
#include "data/byte_level_bpe.h"
#include "data/unicode_tables.h"
#include "data/unicode_text.h"

namespace mcc::data {

// ------------------------------------------------------------------- UTF-8

size_t FindInvalidUtf8(absl::string_view text) {
  size_t i = 0;
  uint32_t cp;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const int len = DecodeUtf8(text, i, &cp);
    if (len == 0) return i;
    i += len;
  }
  return absl::string_view::npos;
}

std::vector<absl::string_view> GPT2PreTokenize(absl::string_view text) {
  const ClassifiedText chars = ClassifyText(text);
  const std::vector<uint32_t>& cps = chars.cps;
  const std::vector<CharClass>& cls = chars.cls;
  const std::vector<size_t>& offs = chars.offs;
  const size_t n = cps.size();
  std::vector<absl::string_view> pieces;
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    const uint32_t c = cps[i];
    // 's 't 're 've 'm 'll 'd
    if (c == '\'' && i + 1 < n) {
      const uint32_t a = cps[i + 1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        j = i + 2;
      } else if (i + 2 < n) {
        const uint32_t b = cps[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
            (a == 'l' && b == 'l')) {
          j = i + 3;
        }
      }
    }
    if (j == i) {
      const bool lead_space = c == ' ' && i + 1 < n;
      const CharClass next = lead_space ? cls[i + 1] : kSpace;
      CharClass run = kSpace;
      if (cls[i] == kLetter || (lead_space && next == kLetter)) {
        run = kLetter;
      } else if (cls[i] == kNumber || (lead_space && next == kNumber)) {
        run = kNumber;
      } else if (cls[i] == kOther || (lead_space && next == kOther)) {
        run = kOther;
      }
      if (run != kSpace) {
        j = (cls[i] == kSpace) ? i + 1 : i;  // the optional leading space
        while (j < n && cls[j] == run) ++j;
      } else {
        // \s+(?!\S) then \s+: a whitespace run keeps its last character for
        // the next piece unless the run ends the text or is one long.
        size_t r = i;
        while (r < n && cls[r] == kSpace) ++r;
        if (r == n) {
          j = n;
        } else if (r - i >= 2) {
          j = r - 1;
        } else {
          j = i + 1;
        }
      }
    }
    pieces.push_back(text.substr(offs[i], offs[j] - offs[i]));
    i = j;
  }
  return pieces;
}

// --------------------------------------------------------------- Tokenizer

void Tokenizer::EncodeWithSpecial(absl::string_view text,
                                  std::vector<int32_t>* out) {
  size_t start = 0;
  while (true) {
    const size_t at = text.find(kEndOfText, start);
    if (at == absl::string_view::npos) {
      Encode(text.substr(start), out);
      return;
    }
    Encode(text.substr(start, at - start), out);
    out->push_back(static_cast<int32_t>(eod()));
    start = at + kEndOfText.size();
  }
}

absl::StatusOr<std::string> Tokenizer::Decode(
    absl::Span<const int32_t> ids) const {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  return Decode(absl::Span<const int64_t>(wide));
}

namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "ByteTokenizer"; }
  int64_t vocab_size() const override { return 257; }
  int64_t eod() const override { return 256; }
  void Encode(absl::string_view text, std::vector<int32_t>* out) override {
    out->reserve(out->size() + text.size());
    for (unsigned char c : text) out->push_back(c);
  }
  absl::StatusOr<std::string> Decode(
      absl::Span<const int64_t> ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t id = ids[i];
      if (id >= 0 && id < 256) {
        s.push_back(static_cast<char>(id));
      } else if (id == 256) {
        s.append(kEndOfText.data(), kEndOfText.size());
      } else {
        return absl::OutOfRangeError(
            absl::StrCat("ByteTokenizer: token ", id, " at position ", i,
                         " is outside the vocabulary of 257"));
      }
    }
    return s;
  }
  std::unique_ptr<Tokenizer> Clone() const override {
    return std::make_unique<ByteTokenizer>();
  }
};

struct GPT2Vocab {
  std::vector<std::string> id_to_bytes;
  absl::flat_hash_map<std::string, int32_t> bytes_to_id;
  int32_t byte_id[256];
  // (left id << 32 | right id) -> (rank, merged id)
  BpeMerges merges;
  int32_t eod = -1;
};

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::NotFoundError(
        absl::StrCat(flag, ": cannot open ", path.empty() ? "(empty)" : path));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class GPT2BPETokenizer : public Tokenizer {
 public:
  explicit GPT2BPETokenizer(std::shared_ptr<const GPT2Vocab> v)
      : v_(std::move(v)) {}
  std::string name() const override { return "GPT2BPETokenizer"; }
  int64_t vocab_size() const override { return v_->id_to_bytes.size(); }
  int64_t eod() const override { return v_->eod; }

  void Encode(absl::string_view text, std::vector<int32_t>* out) override {
    for (absl::string_view piece : GPT2PreTokenize(text)) {
      auto it = cache_.find(piece);
      if (it == cache_.end()) {
        if (cache_.size() > (1 << 20)) cache_.clear();
        it = cache_.emplace(std::string(piece), Bpe(piece)).first;
      }
      out->insert(out->end(), it->second.begin(), it->second.end());
    }
  }

  absl::StatusOr<std::string> Decode(
      absl::Span<const int64_t> ids) const override {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t id = ids[i];
      if (id < 0 || id >= vocab_size()) {
        return absl::OutOfRangeError(
            absl::StrCat("GPT2BPETokenizer: token ", id, " at position ", i,
                         " is outside the vocabulary of ", vocab_size()));
      }
      s += v_->id_to_bytes[id];
    }
    return s;
  }

  std::unique_ptr<Tokenizer> Clone() const override {
    return std::make_unique<GPT2BPETokenizer>(v_);
  }

 private:
  std::vector<int32_t> Bpe(absl::string_view piece) const {
    return ByteLevelBpe(piece, v_->byte_id, v_->merges);
  }

  std::shared_ptr<const GPT2Vocab> v_;
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() {
  return std::make_unique<ByteTokenizer>();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeGPT2BPETokenizer(
    const std::string& vocab_file, const std::string& merge_file) {
  auto vocab_text = ReadFile(vocab_file, "--vocab-file");
  if (!vocab_text.ok()) return vocab_text.status();
  auto merge_text = ReadFile(merge_file, "--merge-file");
  if (!merge_text.ok()) return merge_text.status();
  return MakeGPT2BPETokenizerFromText(*vocab_text, *merge_text, vocab_file,
                                      merge_file);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeGPT2BPETokenizerFromText(
    absl::string_view vocab_text, absl::string_view merge_text,
    const std::string& vocab_file, const std::string& merge_file) {
  auto v = std::make_shared<GPT2Vocab>();
  absl::StatusOr<JsonDocument> entries = ParseJsonDocument(vocab_text);
  if (!entries.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab-file ", vocab_file, ": ", entries.status().message()));
  }
  if (!entries->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab-file ", vocab_file, ": not a JSON object of token -> id"));
  }
  const size_t n = entries->size();
  v->id_to_bytes.resize(n);
  std::vector<bool> seen(n, false);
  std::string bytes;
  for (const auto& [key, value] : entries->items()) {
    if (!value.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vocab-file ", vocab_file, ": the id of \"", key,
                       "\" is not an integer: ", value.dump()));
    }
    // nlohmann stores every non-negative integer unsigned; a negative one is
    // as out of range as one past the end.
    const uint64_t id = value.is_number_unsigned() ? value.get<uint64_t>() : n;
    if (id >= n || seen[id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--vocab-file ", vocab_file, ": id ", value.dump(), " of \"", key,
          "\" is duplicated or outside [0, ", n, ")"));
    }
    if (!ByteLevelToBytes(key, &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vocab-file ", vocab_file, ": token \"", key,
                       "\" is not in GPT-2's byte-to-unicode alphabet"));
    }
    seen[id] = true;
    v->id_to_bytes[id] = bytes;
    v->bytes_to_id[bytes] = static_cast<int32_t>(id);
  }
  if (const int b = FillByteIds(v->bytes_to_id, v->byte_id); b >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab-file ", vocab_file, ": no token for byte ", b));
  }
  auto eod = v->bytes_to_id.find(std::string(kEndOfText));
  if (eod == v->bytes_to_id.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab-file ", vocab_file, ": no \"<|endoftext|>\" token"));
  }
  v->eod = eod->second;

  int32_t rank = 0;
  int line_no = 0;
  std::string left, right;
  for (absl::string_view line : absl::StrSplit(merge_text, '\n')) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.find(' ');
    if (sp == absl::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        !ByteLevelToBytes(line.substr(0, sp), &left) ||
        !ByteLevelToBytes(line.substr(sp + 1), &right)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--merge-file ", merge_file, " line ", line_no,
          ": expected two tokens of GPT-2's alphabet separated by a space"));
    }
    auto l = v->bytes_to_id.find(left);
    auto r = v->bytes_to_id.find(right);
    auto m = v->bytes_to_id.find(left + right);
    if (l == v->bytes_to_id.end() || r == v->bytes_to_id.end() ||
        m == v->bytes_to_id.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--merge-file ", merge_file, " line ", line_no,
          ": the merge or its parts are not in --vocab-file ", vocab_file));
    }
    v->merges.emplace(BpeMergeKey(l->second, r->second),
                      std::make_pair(rank++, m->second));
  }
  return std::unique_ptr<Tokenizer>(new GPT2BPETokenizer(std::move(v)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(
    absl::string_view type, const TokenizerFiles& files) {
  if (type == "GPT2BPETokenizer") {
    return MakeGPT2BPETokenizer(files.vocab_file, files.merge_file);
  }
  if (type == "SentencePieceTokenizer" || type == "HuggingFaceTokenizer") {
    if (files.tokenizer_model.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokenizer-type ", type, " needs --tokenizer-model (",
          type == "HuggingFaceTokenizer" ? "a tokenizer.json"
                                         : "a SentencePiece .model file",
          ")"));
    }
    return type == "HuggingFaceTokenizer"
               ? MakeHuggingFaceTokenizer(files.tokenizer_model)
               : MakeSentencePieceTokenizer(files.tokenizer_model);
  }
  if (type == "ByteTokenizer" || type == "byte") return MakeByteTokenizer();
  return absl::InvalidArgumentError(
      absl::StrCat("--tokenizer-type ", type,
                   " is not supported (use GPT2BPETokenizer, "
                   "SentencePieceTokenizer, HuggingFaceTokenizer or "
                   "ByteTokenizer)"));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> CreateTokenizer(
    absl::string_view type, const std::string& vocab_file,
    const std::string& merge_file) {
  return CreateTokenizer(type, TokenizerFiles{vocab_file, merge_file, ""});
}

bool TokenizerReadsFlag(absl::string_view type, absl::string_view flag) {
  if (type == "GPT2BPETokenizer") {
    return flag == "vocab_file" || flag == "merge_file";
  }
  if (type == "SentencePieceTokenizer" || type == "HuggingFaceTokenizer") {
    return flag == "tokenizer_model";
  }
  return false;
}

}  // namespace mcc::data
