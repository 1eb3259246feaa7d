#include "data/unicode_text.h"

#include "data/unicode_tables.h"

namespace mcc::data {
namespace {

bool InRanges(uint32_t cp, const CodePointRange* r, size_t n) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (cp > r[mid].last) {
      lo = mid + 1;
    } else if (cp < r[mid].first) {
      hi = mid;
    } else {
      return true;
    }
  }
  return false;
}

}  // namespace

int DecodeUtf8(absl::string_view text, size_t i, uint32_t* cp) {
  const unsigned char c = text[i];
  const size_t n = text.size();
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  int len;
  uint32_t v;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    v = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    v = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    v = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > n) return 0;
  for (int k = 1; k < len; ++k) {
    const unsigned char d = text[i + k];
    if ((d & 0xC0) != 0x80) return 0;
    v = (v << 6) | (d & 0x3F);
  }
  if ((len == 3 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))) ||
      (len == 4 && (v < 0x10000 || v > 0x10FFFF))) {
    return 0;
  }
  *cp = v;
  return len;
}

// White_Space as Python's `regex` module (which Megatron's GPT-2 tokenizer
// uses) defines \s.
bool IsSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

CharClass Classify(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return kLetter;
    if (cp >= '0' && cp <= '9') return kNumber;
    if (IsSpace(cp)) return kSpace;
    return kOther;
  }
  if (IsSpace(cp)) return kSpace;
  if (InRanges(cp, kLetterRanges, kLetterRangesSize)) return kLetter;
  if (InRanges(cp, kNumberRanges, kNumberRangesSize)) return kNumber;
  return kOther;
}

ClassifiedText ClassifyText(absl::string_view text) {
  ClassifiedText t;
  t.cps.reserve(text.size());
  t.cls.reserve(text.size());
  t.offs.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    int len = DecodeUtf8(text, i, &cp);
    if (len == 0) {
      cp = 0xFFFD;
      len = 1;
      t.cls.push_back(kOther);
    } else {
      t.cls.push_back(Classify(cp));
    }
    t.cps.push_back(cp);
    t.offs.push_back(i);
    i += len;
  }
  t.offs.push_back(text.size());
  return t;
}

// GPT-2's reversible map from bytes to printable code points.
std::vector<uint32_t> BytesToUnicode() {
  std::vector<uint32_t> map(256, 0);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  int n = 0;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? b : 256 + n++;
  return map;
}

}  // namespace mcc::data
