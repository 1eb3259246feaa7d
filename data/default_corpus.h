#ifndef DATA_DEFAULT_CORPUS_H_
#define DATA_DEFAULT_CORPUS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mcc::data {

// The default training corpus is real English text installed by Debian
// packages that tools/bazel installs: the fortune cookie collection of the
// `fortunes` package (/usr/share/games/fortunes: quotations, literature,
// jokes, definitions; BSD-licensed fortune-mod, see
// /usr/share/doc/fortunes/copyright) and the licence texts in
// /usr/share/common-licenses (base-files). About 15,000 documents, 2.8 MB.
// Each fortune and each licence is one document.
inline constexpr char kFortunesDir[] = "/usr/share/games/fortunes";
inline constexpr char kLicensesDir[] = "/usr/share/common-licenses";

// The documents, in a fixed order (files sorted by name). Texts that are not
// valid UTF-8 are skipped.
absl::StatusOr<std::vector<std::string>> LoadDefaultCorpusDocuments(
    const std::string& fortunes_dir = kFortunesDir,
    const std::string& licenses_dir = kLicensesDir);

// Makes sure "<out_dir>/default_corpus_text_document.{bin,idx}" exists,
// tokenized with the byte-level tokenizer (vocabulary 257, eod 256) with an
// eod after every document, and returns that prefix. Built once; later calls
// find it. Concurrent builders are safe (each writes temporaries and renames).
absl::StatusOr<std::string> EnsureDefaultCorpus(const std::string& out_dir);

}  // namespace mcc::data

#endif  // DATA_DEFAULT_CORPUS_H_
