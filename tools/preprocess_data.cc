// Tokenizes a jsonl corpus into Megatron indexed datasets (.bin/.idx), as
// Megatron-LM's tools/preprocess_data.py does:
//
//   preprocess_data --input corpus.jsonl --json-keys text
//     --output-prefix out/corpus --tokenizer-type GPT2BPETokenizer
//     --vocab-file data/gpt2/encoder.json --merge-file data/gpt2/vocab.bpe
//     --append-eod --workers 2
//
// or --tokenizer-type SentencePieceTokenizer --tokenizer-model tok.model, or
// --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json.
// writes out/corpus_text_document.{bin,idx}. Dashed (Megatron) and
// underscored flag names are both accepted.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/progress_meter.h"
#include "data/conversation_preprocess.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "data/tokenizer_config.h"
#include "glog/logging.h"

ABSL_FLAG(std::string, input, "", "Input jsonl file, one JSON object a line.");
ABSL_FLAG(std::vector<std::string>, json_keys, {"text"},
          "Keys to extract (space- or comma-separated); one output each.");
ABSL_FLAG(std::string, output_prefix, "",
          "Output prefix: writes <prefix>_<key>_document.{bin,idx}.");
ABSL_FLAG(std::string, tokenizer_type, "GPT2BPETokenizer",
          "GPT2BPETokenizer, SentencePieceTokenizer, HuggingFaceTokenizer or "
          "ByteTokenizer.");
ABSL_FLAG(std::string, vocab_file, "", "GPT-2 encoder.json.");
ABSL_FLAG(std::string, merge_file, "", "GPT-2 vocab.bpe (merges).");
ABSL_FLAG(std::string, tokenizer_model, "",
          "SentencePiece .model file (SentencePieceTokenizer) or Hugging Face "
          "tokenizer.json (HuggingFaceTokenizer).");
ABSL_FLAG(bool, append_eod, false, "End every document with the eod token.");
ABSL_FLAG(int, workers, 1, "Tokenizer threads.");
ABSL_FLAG(bool, skip_bad_records, false,
          "Skip and count records that are not valid JSON, lack a key, hold "
          "invalid UTF-8 or an empty text, instead of stopping at the first.");
ABSL_FLAG(bool, sft, false,
          "Records are conversations ({\"messages\": [{\"role\", "
          "\"content\"}...]}), rendered with the chat template of "
          "tokenizer_config.json: writes <prefix>_messages_document.{bin,idx} "
          "and its loss mask <prefix>_messages_document_loss_mask.{bin,idx} "
          "(1 on the assistant's tokens), for train --sft. One worker.");
ABSL_FLAG(std::string, tokenizer_config, "",
          "--sft: the tokenizer_config.json holding chat_template, bos_token "
          "and eos_token (default: beside --tokenizer-model).");
ABSL_FLAG(int64_t, log_interval, 10000,
          "Documents between progress lines when stderr is not a terminal "
          "(on a terminal, one line is redrawn in place instead).");

namespace {

// "--json-keys text title" and "--json-keys=text" -> "--json_keys=text,title".
std::vector<std::string> TranslateArgs(int argc, char** argv) {
  std::vector<std::string> out = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      const size_t eq = a.find('=');
      std::string name =
          a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      std::replace(name.begin(), name.end(), '-', '_');
      a = "--" + name + (eq == std::string::npos ? "" : a.substr(eq));
      if (name == "json_keys" && eq == std::string::npos) {
        std::vector<std::string> keys;
        while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
          keys.push_back(argv[++i]);
        }
        a += "=" + absl::StrJoin(keys, ",");
      }
    }
    out.push_back(a);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "preprocess_data --input file.jsonl --json-keys text --output-prefix P "
      "--tokenizer-type GPT2BPETokenizer --vocab-file encoder.json "
      "--merge-file vocab.bpe --append-eod --workers N");
  std::vector<std::string> args = TranslateArgs(argc, argv);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(cargs.size()), cargs.data());
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // Linked in with the thread pool, but tokenizing runs on --workers threads.
  if (const absl::CommandLineFlag* f = absl::FindCommandLineFlag("num_threads");
      f != nullptr && f->CurrentValue() != f->DefaultValue()) {
    std::fprintf(stderr,
                 "preprocess_data: --num-threads: tokenizing runs on "
                 "--workers threads; give --workers instead\n");
    return 2;
  }

  const std::string tokenizer_type = absl::GetFlag(FLAGS_tokenizer_type);
  auto tok = mcc::data::CreateTokenizer(
      tokenizer_type,
      mcc::data::TokenizerFiles{absl::GetFlag(FLAGS_vocab_file),
                                absl::GetFlag(FLAGS_merge_file),
                                absl::GetFlag(FLAGS_tokenizer_model)});
  if (!tok.ok()) {
    std::fprintf(stderr, "preprocess_data: %s\n",
                 std::string(tok.status().message()).c_str());
    return 2;
  }
  for (const char* name : {"vocab_file", "merge_file", "tokenizer_model"}) {
    if (!absl::FindCommandLineFlag(name)->CurrentValue().empty() &&
        !mcc::data::TokenizerReadsFlag(tokenizer_type, name)) {
      std::string dashed = name;
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      LOG(WARNING) << "--" << dashed << " has no effect in this run: "
                   << "--tokenizer-type " << tokenizer_type
                   << " does not read it";
    }
  }
  if (absl::GetFlag(FLAGS_sft)) {
    std::string config_path = absl::GetFlag(FLAGS_tokenizer_config);
    if (config_path.empty()) config_path = absl::GetFlag(FLAGS_tokenizer_model);
    if (config_path.empty()) {
      std::fprintf(stderr,
                   "preprocess_data: --sft needs --tokenizer-config (or "
                   "--tokenizer-model with tokenizer_config.json beside it)\n");
      return 2;
    }
    const std::vector<std::string> keys = absl::GetFlag(FLAGS_json_keys);
    if (keys != std::vector<std::string>{"text"} &&
        keys != std::vector<std::string>{"messages"}) {
      std::fprintf(stderr,
                   "preprocess_data: --json-keys: --sft reads the key "
                   "\"messages\" only\n");
      return 2;
    }
    auto chat = mcc::data::ReadTokenizerConfig(config_path);
    if (!chat.ok()) {
      std::fprintf(stderr, "preprocess_data: --tokenizer-config: %s\n",
                   std::string(chat.status().message()).c_str());
      return 2;
    }
    if (absl::GetFlag(FLAGS_workers) != 1) {
      LOG(WARNING) << "--workers has no effect in this run: --sft tokenizes "
                      "on one thread";
    }
    mcc::data::ConversationPreprocessOptions co;
    co.input = absl::GetFlag(FLAGS_input);
    co.output_prefix = absl::GetFlag(FLAGS_output_prefix);
    co.append_eod = absl::GetFlag(FLAGS_append_eod);
    co.skip_bad_records = absl::GetFlag(FLAGS_skip_bad_records);
    auto stats = mcc::data::PreprocessConversations(co, *chat, **tok);
    if (!stats.ok()) {
      std::fprintf(stderr, "preprocess_data: %s\n",
                   std::string(stats.status().message()).c_str());
      return 1;
    }
    std::printf(
        "preprocess_data: %lld conversations (%lld skipped, %lld "
        "tokens) -> %s.{bin,idx}\n",
        static_cast<long long>(stats->documents),
        static_cast<long long>(stats->skipped),
        static_cast<long long>(stats->tokens),
        absl::StrJoin(stats->output_prefixes, ",").c_str());
    return 0;
  }
  if (!absl::GetFlag(FLAGS_tokenizer_config).empty()) {
    LOG(WARNING) << "--tokenizer-config has no effect in this run: only "
                    "--sft reads it";
  }
  mcc::data::PreprocessOptions o;
  o.input = absl::GetFlag(FLAGS_input);
  o.json_keys = absl::GetFlag(FLAGS_json_keys);
  o.output_prefix = absl::GetFlag(FLAGS_output_prefix);
  o.append_eod = absl::GetFlag(FLAGS_append_eod);
  o.workers = absl::GetFlag(FLAGS_workers);
  o.skip_bad_records = absl::GetFlag(FLAGS_skip_bad_records);

  // Progress: a line redrawn in place when stderr is a terminal, plain lines
  // every --log-interval documents when it is not; then one summary line on
  // stdout either way.
  mcc::ProgressMeter::Options progress;
  progress.label = "preprocess_data";
  progress.unit = "documents";
  std::error_code size_error;
  const uintmax_t input_size = std::filesystem::file_size(o.input, size_error);
  progress.total_bytes = size_error ? 0 : static_cast<int64_t>(input_size);
  progress.terminal = mcc::ProgressMeter::IsTerminal(stderr);
  progress.log_every = absl::GetFlag(FLAGS_log_interval);
  progress.write_summary = [](absl::string_view line) {
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
  };
  mcc::ProgressMeter meter(progress);
  auto stats = mcc::data::PreprocessJsonl(
      o, **tok, [&meter](const mcc::data::PreprocessStats& s) {
        meter.Update(s.documents, s.input_bytes);
      });
  if (!stats.ok()) {
    if (progress.terminal) std::fputc('\n', stderr);  // Keep the last line.
    std::fprintf(stderr, "preprocess_data: %s\n",
                 std::string(stats.status().message()).c_str());
    return 1;
  }
  meter.Finish(
      stats->documents, stats->input_bytes,
      absl::StrFormat(" (%d skipped, %d tokens, %d workers) -> %s.{bin,idx}",
                      stats->skipped, stats->tokens, std::max(1, o.workers),
                      absl::StrJoin(stats->output_prefixes, ",")));
  return 0;
}
