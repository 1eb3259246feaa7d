#include "data/default_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "glog/logging.h"

namespace mcc::data {
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> RegularFiles(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_symlink() || !e.is_regular_file()) continue;
    if (e.path().extension() == ".dat") continue;
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string Slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> LoadDefaultCorpusDocuments(
    const std::string& fortunes_dir, const std::string& licenses_dir) {
  std::vector<std::string> docs;
  int64_t skipped = 0;
  const auto fortunes = RegularFiles(fortunes_dir);
  if (fortunes.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "default corpus: no fortune files in ", fortunes_dir,
        " (install the Debian package `fortunes`: tools/bazel installs it, "
        "or run apt-get install fortunes)"));
  }
  for (const fs::path& p : fortunes) {
    const std::string text = Slurp(p);
    // Fortunes are separated by lines holding a single '%'.
    for (absl::string_view part : absl::StrSplit(text, "\n%\n")) {
      part = absl::StripPrefix(part, "%\n");
      part = absl::StripTrailingAsciiWhitespace(part);
      if (part.empty()) continue;
      if (FindInvalidUtf8(part) != absl::string_view::npos) {
        ++skipped;
        continue;
      }
      docs.emplace_back(part);
    }
  }
  for (const fs::path& p : RegularFiles(licenses_dir)) {
    std::string text = Slurp(p);
    if (text.empty() || FindInvalidUtf8(text) != absl::string_view::npos) {
      ++skipped;
      continue;
    }
    docs.push_back(std::move(text));
  }
  if (skipped > 0) {
    VLOG(1) << "default corpus: skipped " << skipped << " non-UTF-8 texts";
  }
  return docs;
}

absl::StatusOr<std::string> EnsureDefaultCorpus(const std::string& out_dir) {
  const std::string prefix =
      (fs::path(out_dir) / "default_corpus_text_document").string();
  std::error_code ec;
  if (fs::is_regular_file(IdxPath(prefix), ec) &&
      fs::is_regular_file(BinPath(prefix), ec)) {
    auto ds = IndexedDataset::Open(prefix);
    if (ds.ok()) return prefix;
    LOG(WARNING) << "rebuilding the default corpus: " << ds.status();
  }
  fs::create_directories(out_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat(
        "default corpus: cannot create ", out_dir, ": ", ec.message()));
  }
  auto docs = LoadDefaultCorpusDocuments();
  if (!docs.ok()) return docs.status();
  auto tok = MakeByteTokenizer();
  auto builder = IndexedDatasetBuilder::Create(
      prefix, OptimalTokenDType(tok->vocab_size()));
  if (!builder.ok()) return builder.status();
  std::vector<int32_t> ids;
  int64_t bytes = 0;
  for (const std::string& d : *docs) {
    ids.clear();
    tok->Encode(d, &ids);
    ids.push_back(static_cast<int32_t>(tok->eod()));
    absl::Status s = (*builder)->AddDocument(ids);
    if (!s.ok()) return s;
    bytes += d.size();
  }
  absl::Status s = (*builder)->Finalize();
  if (!s.ok()) return s;
  LOG(INFO) << "default corpus: " << docs->size() << " documents, " << bytes
            << " bytes of text -> " << prefix << ".{bin,idx}";
  return prefix;
}

}  // namespace mcc::data
