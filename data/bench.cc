// Data pipeline benchmark: tokenizer MB/s, preprocess MB/s, and loader
// samples/s beside a plain sequential read of the same .bin, on the default
// corpus. Run: tools/bazel run //data:bench
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/thread_pool.h"
#include "data/blended_dataset.h"
#include "data/default_corpus.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/jsonl_record.h"
#include "data/loader.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, vocab_file, "data/gpt2/encoder.json", "GPT-2 vocab");
ABSL_FLAG(std::string, merge_file, "data/gpt2/vocab.bpe", "GPT-2 merges");
ABSL_FLAG(int, workers, 2, "preprocess workers");
ABSL_FLAG(int, seq_length, 1024, "sequence length for the loader");
ABSL_FLAG(int, micro_batch_size, 8, "micro batch size for the loader");

namespace mcc::data {
namespace {

double Seconds(absl::Time t0) {
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

int Main() {
  auto docs = LoadDefaultCorpusDocuments();
  CHECK(docs.ok()) << docs.status();
  int64_t bytes = 0;
  for (const auto& d : *docs) bytes += d.size();
  const double mb = bytes / 1e6;
  std::printf("corpus: %zu documents, %.2f MB (default corpus)\n", docs->size(),
              mb);
  std::printf("| measurement | value |\n|---|---|\n");

  auto gpt2_or = MakeGPT2BPETokenizer(absl::GetFlag(FLAGS_vocab_file),
                                      absl::GetFlag(FLAGS_merge_file));
  CHECK(gpt2_or.ok()) << gpt2_or.status();
  std::unique_ptr<Tokenizer> gpt2 = std::move(gpt2_or).value();
  auto byte = MakeByteTokenizer();
  int64_t n_ids = 0;
  for (Tokenizer* t : {byte.get(), gpt2.get()}) {
    for (int pass = 0; pass < 2; ++pass) {
      auto fresh = t->Clone();
      std::vector<int32_t> ids;
      const absl::Time t0 = absl::Now();
      for (const auto& d : *docs) {
        ids.clear();
        fresh->Encode(d, &ids);
        n_ids += ids.size();
      }
      // Second pass on the same instance: warm BPE cache.
      if (pass == 1) {
        const absl::Time t1 = absl::Now();
        for (const auto& d : *docs) {
          ids.clear();
          fresh->Encode(d, &ids);
        }
        std::printf("| %s encode, warm cache, 1 thread | %.1f MB/s |\n",
                    t->name().c_str(), mb / Seconds(t1));
      } else {
        std::printf("| %s encode, cold cache, 1 thread | %.1f MB/s |\n",
                    t->name().c_str(), mb / Seconds(t0));
      }
    }
  }
  {
    std::vector<int32_t> ids;
    for (const auto& d : *docs) gpt2->Encode(d, &ids);
    const absl::Time t0 = absl::Now();
    auto s = gpt2->Decode(ids);
    CHECK(s.ok());
    std::printf("| GPT2BPETokenizer decode | %.1f MB/s |\n", mb / Seconds(t0));
  }

  const std::string dir =
      (std::filesystem::temp_directory_path() / "mcc_data_bench").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/corpus.jsonl", std::ios::binary);
    std::string line;
    for (const auto& d : *docs) {
      // Replace bytes that are not UTF-8 (JSON text must be).
      line = nlohmann::json{{"text", d}}.dump(
          -1, ' ', false, nlohmann::json::error_handler_t::replace);
      f << line << "\n";
    }
  }
  {
    // The jsonl parse alone, as preprocess reads each line: simdjson (what
    // preprocess uses) beside nlohmann-json (what it would use otherwise).
    std::vector<std::string> lines;
    std::ifstream f(dir + "/corpus.jsonl", std::ios::binary);
    int64_t line_bytes = 0;
    for (std::string l; std::getline(f, l);) {
      line_bytes += l.size() + 1;
      lines.push_back(std::move(l));
    }
    const std::vector<std::string> keys = {"text"};
    for (int pass = 0; pass < 2; ++pass) {
      JsonlRecordReader reader;
      std::vector<std::optional<std::string_view>> values;
      int64_t chars = 0;
      const absl::Time t0 = absl::Now();
      for (const std::string& l : lines) {
        CHECK(reader.Read(l, keys, &values).ok());
        chars += values[0]->size();
      }
      const double simd = Seconds(t0);
      const absl::Time t1 = absl::Now();
      for (const std::string& l : lines) {
        chars -= nlohmann::json::parse(l)["text"]
                     .get_ref<const std::string&>()
                     .size();
      }
      const double nl = Seconds(t1);
      CHECK_EQ(chars, 0);
      if (pass == 1) {
        std::printf(
            "| jsonl parse, simdjson (JsonlRecordReader) | %.1f MB/s |\n",
            line_bytes / 1e6 / simd);
        std::printf("| jsonl parse, nlohmann-json | %.1f MB/s |\n",
                    line_bytes / 1e6 / nl);
      }
    }
  }
  std::string gpt2_prefix;
  for (Tokenizer* t : {byte.get(), gpt2.get()}) {
    for (int workers : {1, absl::GetFlag(FLAGS_workers)}) {
      PreprocessOptions o;
      o.input = dir + "/corpus.jsonl";
      o.output_prefix = dir + "/" + t->name();
      o.append_eod = true;
      o.workers = workers;
      auto st = PreprocessJsonl(o, *t);
      CHECK(st.ok()) << st.status();
      std::printf(
          "| preprocess_data %s, %d worker(s) | %.1f MB/s (%.0f docs/s) |\n",
          t->name().c_str(), workers, st->input_bytes / 1e6 / st->seconds,
          st->documents / st->seconds);
      if (t == gpt2.get()) gpt2_prefix = st->output_prefixes[0];
    }
  }

  auto ds_or = IndexedDataset::Open(gpt2_prefix);
  CHECK(ds_or.ok()) << ds_or.status();
  std::shared_ptr<const IndexedDataset> ds = std::move(ds_or).value();
  const int seq = absl::GetFlag(FLAGS_seq_length);
  const int mbs = absl::GetFlag(FLAGS_micro_batch_size);
  GPTDatasetConfig config;
  config.sequence_length = seq;
  config.path_to_cache = dir + "/cache";
  const int64_t want = 20000;
  absl::Time t0 = absl::Now();
  auto g = GPTDataset::Build(ds, 0, ds->num_sequences(), want, Split::kTrain,
                             config);
  CHECK(g.ok()) << g.status();
  std::printf("| GPT index build (%lld samples of %d, %d epochs) | %.3f s |\n",
              static_cast<long long>((*g)->size()), seq,
              (*g)->indices().num_epochs, Seconds(t0));
  t0 = absl::Now();
  auto g2 = GPTDataset::Build(ds, 0, ds->num_sequences(), want, Split::kTrain,
                              config);
  CHECK(g2.ok());
  std::printf("| GPT index load from cache | %.3f s |\n", Seconds(t0));
  std::shared_ptr<const SampleDataset> samples(std::move(g).value());

  // Plain sequential read: the same number of tokens straight from the .bin,
  // widened to int64 as the loader does.
  const int64_t n_samples = (samples->size() / mbs) * mbs;
  {
    std::vector<int64_t> buf(seq + 1);
    int64_t seqi = 0, off = 0, sum = 0;
    t0 = absl::Now();
    for (int64_t s = 0; s < n_samples; ++s) {
      int64_t got = 0;
      while (got < seq + 1) {
        if (seqi == ds->num_sequences()) seqi = 0, off = 0;
        const int64_t len = std::min<int64_t>(
            seq + 1 - got, ds->sequence_lengths()[seqi] - off);
        ds->Read(seqi, off, len, buf.data() + got);
        got += len;
        off += len;
        if (off == ds->sequence_lengths()[seqi]) ++seqi, off = 0;
      }
      sum += buf[0];
    }
    std::printf(
        "| plain sequential read of the .bin (seq %d) | %.0f samples/s |\n",
        seq, n_samples / Seconds(t0));
    if (sum == 42) std::printf("\n");
  }
  {
    LoaderConfig lc;
    lc.micro_batch_size = mbs;
    auto loader = DataLoader::Create(samples, lc);
    CHECK(loader.ok());
    t0 = absl::Now();
    int64_t n = 0;
    while (true) {
      auto b = (*loader)->Next();
      if (!b.ok()) break;
      n += mbs;
    }
    std::printf(
        "| DataLoader (shuffled GPT samples, mbs %d, seq %d, prefetch) | %.0f "
        "samples/s |\n",
        mbs, seq, n / Seconds(t0));
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
