// Tokenizer benchmark: MB/s of each --tokenizer-type on the default corpus,
// encode alone on one thread and through preprocess_data's pipeline
// (PreprocessJsonl: jsonl parse, tokenize, .bin/.idx write) with 1 and
// --workers threads. The SentencePiece model is trained here with Debian's
// spm_train (Llama-style BPE); the tokenizer.json files are GPT-2's full
// vocabulary in GPT-2's and in Llama 3's layouts. Run:
//   tools/bazel run -c opt //data:tokenizer_bench -- --workers 2
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/json_document.h"
#include "core/thread_pool.h"
#include "data/default_corpus.h"
#include "data/huggingface_tokenizer.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "glog/logging.h"

ABSL_FLAG(std::string, vocab_file, "data/gpt2/encoder.json", "GPT-2 vocab");
ABSL_FLAG(std::string, merge_file, "data/gpt2/vocab.bpe", "GPT-2 merges");
ABSL_FLAG(int, workers, 2, "preprocess workers for the second run");
ABSL_FLAG(int, sp_vocab_size, 8000, "SentencePiece vocabulary to train");

namespace mcc::data {
namespace {

double Seconds(absl::Time t0) {
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  CHECK(f) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// GPT-2's encoder.json + vocab.bpe as a tokenizer.json, in GPT-2's layout or
// in Llama 3's (Split by Llama 3's regex, ByteLevel without regex,
// ignore_merges).
std::string Gpt2TokenizerJson(bool llama3_layout) {
  auto encoder = ParseJsonDocument(ReadAll(absl::GetFlag(FLAGS_vocab_file)));
  CHECK(encoder.ok()) << encoder.status();
  JsonDocument merges = JsonDocument::array();
  std::istringstream bpe(ReadAll(absl::GetFlag(FLAGS_merge_file)));
  for (std::string line; std::getline(bpe, line);) {
    if (!line.empty() && line[0] != '#') merges.push_back(line);
  }
  JsonDocument pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
  if (llama3_layout) {
    const char* llama3 =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", llama3}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  }
  JsonDocument doc = {
      {"added_tokens",
       {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre},
      {"model",
       {{"type", "BPE"},
        {"ignore_merges", llama3_layout},
        {"vocab", *encoder},
        {"merges", merges}}},
  };
  return doc.dump();
}

int Main() {
  auto docs = LoadDefaultCorpusDocuments();
  CHECK(docs.ok()) << docs.status();
  int64_t bytes = 0;
  for (const auto& d : *docs) bytes += d.size();
  const double mb = bytes / 1e6;
  const std::string dir =
      (std::filesystem::temp_directory_path() / "mcc_tokenizer_bench").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream jsonl(dir + "/corpus.jsonl", std::ios::binary);
    std::ofstream text(dir + "/corpus.txt", std::ios::binary);
    for (const auto& d : *docs) {
      jsonl << JsonDocument{{"text", d}}.dump(
                   -1, ' ', false, JsonDocument::error_handler_t::replace)
            << "\n";
      text << d << "\n";
    }
  }
  const std::string sp_model = dir + "/sp.model";
  {
    const std::string cmd = absl::StrCat(
        "spm_train --input=", dir, "/corpus.txt --model_prefix=", dir,
        "/sp --vocab_size=", absl::GetFlag(FLAGS_sp_vocab_size),
        " --model_type=bpe --normalization_rule_name=identity "
        "--remove_extra_whitespaces=false --byte_fallback=true "
        "--split_digits=true --character_coverage=0.9995 --num_threads=2 "
        "--minloglevel=2 > ",
        dir, "/spm_train.log 2>&1");
    CHECK_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  for (bool llama3 : {false, true}) {
    std::ofstream f(dir + (llama3 ? "/llama3.json" : "/gpt2.json"));
    f << Gpt2TokenizerJson(llama3);
  }

  struct Entry {
    std::string label, type;
    TokenizerFiles files;
  };
  const std::vector<Entry> entries = {
      {"GPT2BPETokenizer (GPT-2 50257)",
       "GPT2BPETokenizer",
       {absl::GetFlag(FLAGS_vocab_file), absl::GetFlag(FLAGS_merge_file), ""}},
      {absl::StrCat("SentencePieceTokenizer (BPE ",
                    absl::GetFlag(FLAGS_sp_vocab_size), ", Llama-style)"),
       "SentencePieceTokenizer",
       {"", "", sp_model}},
      {"HuggingFaceTokenizer (GPT-2 50257, GPT-2 layout)",
       "HuggingFaceTokenizer",
       {"", "", dir + "/gpt2.json"}},
      {"HuggingFaceTokenizer (GPT-2 50257, Llama 3 regex)",
       "HuggingFaceTokenizer",
       {"", "", dir + "/llama3.json"}},
  };
  std::printf("corpus: %zu documents, %.2f MB (default corpus)\n", docs->size(),
              mb);
  std::printf(
      "| tokenizer | encode, 1 thread | preprocess_data, 1 worker | "
      "preprocess_data, %d workers |\n|---|---|---|---|\n",
      absl::GetFlag(FLAGS_workers));
  for (const Entry& e : entries) {
    auto t = CreateTokenizer(e.type, e.files);
    CHECK(t.ok()) << t.status();
    // Encode alone, a fresh instance (cold cache), one thread.
    auto fresh = (*t)->Clone();
    std::vector<int32_t> ids;
    const absl::Time t0 = absl::Now();
    for (const auto& d : *docs) {
      ids.clear();
      fresh->Encode(d, &ids);
    }
    const double encode = mb / Seconds(t0);
    double pre[2];
    int k = 0;
    for (int workers : {1, absl::GetFlag(FLAGS_workers)}) {
      PreprocessOptions o;
      o.input = dir + "/corpus.jsonl";
      o.output_prefix = dir + "/out";
      o.append_eod = true;
      o.workers = workers;
      auto st = PreprocessJsonl(o, **t);
      CHECK(st.ok()) << st.status();
      pre[k++] = st->input_bytes / 1e6 / st->seconds;
    }
    std::printf("| %s | %.2f MB/s | %.2f MB/s | %.2f MB/s |\n", e.label.c_str(),
                encode, pre[0], pre[1]);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace mcc::data

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  return mcc::data::Main();
}
