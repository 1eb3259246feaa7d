// Every flag of every binary in tools/ either changes what the binary does or
// is refused (issue 16: a Megatron user who passes a flag gets its effect or a
// one-line refusal, never silence).
//
// Each binary lists its registered flags (--helpfull), and the table below
// must classify exactly that set: a flag added without a row fails
// EveryFlagIsClassified. Each row runs the binary (tiny model, 1-2 steps)
// with and without the flag in some context and checks the verdict:
//   kEffect:  exit 0 and a different observation (normalised log, output
//             files and their contents);
//   kRefused: exit 2 with one stderr line naming the flag;
//   kWarned:  the flag matters only in other modes: exit 0, a warning naming
//             it, and otherwise the same observation.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "training/train_config.pb.h"

namespace {

std::map<std::string, std::string> g_bin;  // "train" -> path.
std::string g_tmp;                         // Inputs made once.
std::string g_out;                         // Wiped before every run.
std::string g_gpt2_vocab, g_gpt2_merges;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void RemoveTree(const std::string& path) {
  std::system(absl::StrCat("rm -rf '", path, "'").c_str());
}

// Every file under dir (relative name, size, content hash), sorted.
void ListTree(const std::string& dir, const std::string& rel,
              std::vector<std::string>* out) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = dir + "/" + name;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      ListTree(path, rel + name + "/", out);
    } else {
      std::string content = ReadFile(path);
      if (absl::StartsWith(name, "events.out.tfevents.")) {
        // TensorBoard: the name holds the time and pid, the records wall
        // times; what repeats is how many records there are.
        size_t records = 0;
        for (size_t pos = 0; pos + 12 <= content.size(); ++records) {
          uint64_t length = 0;
          std::memcpy(&length, content.data() + pos, 8);
          pos += 16 + length;
        }
        out->push_back(
            absl::StrCat(rel, "events.out.tfevents.*: ", records, " records"));
        continue;
      }
      if (absl::StartsWith(name, "trace_rank") &&
          absl::EndsWith(name, ".json")) {
        // A --profile timeline: its times vary; which steps it covers and
        // how many forwards and backwards it holds do not.
        std::set<std::string> steps;
        static const std::regex step("\"step\":\"([0-9]+)\"");
        for (std::sregex_iterator it(content.begin(), content.end(), step), end;
             it != end; ++it) {
          steps.insert((*it)[1]);
        }
        size_t compute = 0;
        for (size_t pos = 0; (pos = content.find("\"cat\":\"compute\"", pos)) !=
                             std::string::npos;
             ++pos) {
          ++compute;
        }
        out->push_back(absl::StrCat(rel, name, ": steps ",
                                    absl::StrJoin(steps, ","), ", ", compute,
                                    " forwards and backwards"));
        continue;
      }
      if (absl::EndsWith(name, ".jsonl")) {
        // Metrics: the timing fields vary from run to run.
        content = std::regex_replace(
            content,
            std::regex("\"(seconds_per_iteration|tokens_per_sec|tflops|mfu|"
                       "mem_current_bytes)\": [-0-9.e+]+"),
            "\"$1\": T");
      }
      if (name == "metadata.pb" || absl::EndsWith(name, ".crc")) {
        // A checkpoint's metadata records when it was written (and a local
        // checkpoint's checksum file covers the metadata).
        out->push_back(rel + name);
        continue;
      }
      out->push_back(absl::StrCat(rel, name, " ", content.size(), " bytes #",
                                  std::hash<std::string>()(content)));
    }
  }
  closedir(d);
}

struct Outcome {
  int code = -1;
  std::string out, err;
  std::string command;
};

Outcome Execute(const std::vector<std::string>& args,
                const std::vector<std::string>& env = {}) {
  RemoveTree(g_out);
  mkdir(g_out.c_str(), 0755);
  const std::string out_path = g_tmp + "/stdout", err_path = g_tmp + "/stderr";
  pid_t pid = fork();
  if (pid == 0) {
    int o = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    if (chdir(g_tmp.c_str()) != 0) _exit(126);
    for (const std::string& kv : env) putenv(strdup(kv.c_str()));
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(strdup(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  Outcome r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  r.command = absl::StrJoin(args, " ");
  return r;
}

// A run's output with what varies between identical runs masked (glog's
// time, pid and line, durations and rates), its lines sorted (ranks
// interleave), plus the files it wrote.
std::vector<std::string> Observe(const Outcome& r, bool several_ranks) {
  static const std::vector<std::pair<std::regex, std::string>> masks = {
      {std::regex(R"(^(\[rank \d+\] )?([IWEF])\d{8} [0-9:.]+ +\d+ [^\]]*\] )"),
       "$1$2 "},
      {std::regex(R"(elapsed time per iteration \(ms\): [0-9.]+)"),
       "elapsed time per iteration (ms): T"},
      {std::regex(R"((tokens/s|TFLOP/s|ETA):? [0-9.:hms]+)"), "$1 T"},
      {std::regex(R"(MFU: [0-9.]+%)"), "MFU: T%"},
      {std::regex(R"(bubble measured [0-9.]+)"), "bubble measured T"},
      // Measured durations have decimals; a configured one ("grace period
      // of 200ms") stays.
      // Durations; microseconds print without a fraction ("in 327us").
      // Whole milliseconds stay: launch's grace period is observed by them.
      {std::regex(R"([0-9]+\.[0-9]+ ?(s|ms|us)\b|[0-9]+ ?us\b)"), "T"},
      // Current memory depends on the data loader's prefetching thread.
      {std::regex(R"(memory: [0-9.]+ [KMG]?i?B)"), "memory: M"},
      {std::regex(R"([0-9.]+ (tokens/s|docs/s|documents/s|samples/s|MB/s)\b)"),
       "T $1"},
      {std::regex(R"(\(ms\): [0-9.]+)"), "(ms): T"},
      {std::regex(R"(pid \d+)"), "pid P"},
      // --log-straggler's ratios to the median.
      {std::regex(R"(\([0-9]+\.[0-9]+x)"), "(Rx"},
  };
  std::vector<std::string> lines;
  for (const std::string* text : {&r.out, &r.err}) {
    for (absl::string_view l : absl::StrSplit(*text, '\n')) {
      std::string line(l);
      if (line.empty()) continue;
      for (const auto& [re, with] : masks) {
        line = std::regex_replace(line, re, with);
      }
      if (several_ranks) {
        // Peak memory depends on when other ranks' messages arrive.
        static const std::regex memory(R"(memory: [^|]*)");
        line = std::regex_replace(line, memory, "memory: M ");
      }
      lines.push_back(line);
    }
  }
  std::sort(lines.begin(), lines.end());
  lines.insert(lines.begin(), absl::StrCat("exit ", r.code));
  ListTree(g_out, "", &lines);
  return lines;
}

// The lines only one of two observations has.
std::string Diff(const std::vector<std::string>& a,
                 const std::vector<std::string>& b) {
  std::vector<std::string> only_a, only_b;
  std::set<std::string> sa(a.begin(), a.end()), sb(b.begin(), b.end());
  std::set_difference(sa.begin(), sa.end(), sb.begin(), sb.end(),
                      std::back_inserter(only_a));
  std::set_difference(sb.begin(), sb.end(), sa.begin(), sa.end(),
                      std::back_inserter(only_b));
  return absl::StrCat("only with the flag:\n  ", absl::StrJoin(only_a, "\n  "),
                      "\nonly without:\n  ", absl::StrJoin(only_b, "\n  "));
}

std::string Show(const Outcome& r) {
  return absl::StrCat("$ ", r.command, "\nexit ", r.code, "\n--- stdout\n",
                      r.out.substr(0, 3000), "\n--- stderr\n",
                      r.err.substr(0, 3000));
}

std::string Dashed(const std::string& name) {
  return absl::StrReplaceAll(name, {{"_", "-"}});
}

// The flags a binary registers, from its --helpfull (ours: "  --name (default
// ...", Abseil's: "    --name (help...").
std::set<std::string> RegisteredFlags(const std::string& binary) {
  Outcome r = Execute({g_bin[binary], "--helpfull"});
  std::set<std::string> names;
  static const std::regex line(R"(^\s+--([A-Za-z0-9_-]+) \()");
  for (absl::string_view l : absl::StrSplit(r.out + r.err, '\n')) {
    std::smatch m;
    std::string s(l);
    if (std::regex_search(s, m, line)) {
      names.insert(absl::StrReplaceAll(m[1].str(), {{"-", "_"}}));
    }
  }
  return names;
}

// Where a row runs: the binary's arguments before the row's (`args`), those
// after (`tail`: launch's program), the environment, and how many processes
// (more than one: under tools/launch).
struct Context {
  std::vector<std::string> args;
  std::vector<std::string> tail;
  int nproc = 1;
  std::vector<std::string> env;
};

enum class Verdict { kEffect, kRefused, kWarned };

struct Row {
  std::string binary;
  std::string flag;  // Underscored.
  Verdict verdict;
  std::vector<std::string> args;  // How the row sets the flag.
  Context context;
  std::vector<std::string> env = {};  // Added to the context's.
  int code = 0;                       // kEffect's exit code.
};

Context With(Context c, std::vector<std::string> more) {
  c.args.insert(c.args.end(), more.begin(), more.end());
  return c;
}

Context Nproc(Context c, int n) {
  c.nproc = n;
  return c;
}

Outcome RunIn(const std::string& binary, const Context& c,
              const std::vector<std::string>& args,
              const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv;
  if (c.nproc > 1) {
    argv = {g_bin["launch"], "--nproc_per_node", std::to_string(c.nproc), "--"};
  }
  argv.push_back(g_bin[binary]);
  argv.insert(argv.end(), c.args.begin(), c.args.end());
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), c.tail.begin(), c.tail.end());
  std::vector<std::string> all_env = c.env;
  all_env.insert(all_env.end(), env.begin(), env.end());
  return Execute(argv, all_env);
}

// The contexts (filled by SetUpTestSuite, once inputs exist).
struct Contexts {
  Context train_mock, train_data, train_sft, preprocess_sft, eval_loss,
      eval_gen, eval_data, export_hf, import_hf, preprocess, launch,
      launch_grace, launch_node1, launch_linger;
};
Contexts ctx;

std::vector<Row> Table() {
  using V = Verdict;
  std::vector<Row> t;
  auto add = [&t](const std::string& bin, const std::string& flag, V v,
                  std::vector<std::string> args, Context c,
                  std::vector<std::string> env = {}) {
    t.push_back({bin, flag, v, std::move(args), std::move(c), std::move(env)});
  };
  const Context& tm = ctx.train_mock;
  const Context& td = ctx.train_data;
  const Context fp16 = With(tm, {"--fp16"});
  const Context dp2 = Nproc(tm, 2);
  const Context pp2 =
      Nproc(With(tm, {"--pipeline-model-parallel-size", "2", "--num-layers",
                      "4", "--global-batch-size", "4"}),
            2);
  const Context rope = With(tm, {"--position-embedding-type", "rope"});
  // Enough layers and tokens for activations to set the peak memory.
  const Context deep = With(tm, {"--num-layers", "4", "--seq-length", "64"});
  const Context full = With(deep, {"--recompute-granularity", "full"});
  const Context saving = With(tm, {"--save", g_out + "/ckpt"});
  // The checkpoints' vocabulary is the byte tokenizer's.
  const Context tm257 = With(tm, {"--vocab-size", "257"});
  const Context loading =
      With(tm257, {"--load", g_tmp + "/ckpt_a", "--hidden-dropout", "0.1"});
  const std::string gpt2_args[] = {"--tokenizer-type", "GPT2BPETokenizer",
                                   "--vocab-file",     g_gpt2_vocab,
                                   "--merge-file",     g_gpt2_merges};
  const std::vector<std::string> gpt2(std::begin(gpt2_args),
                                      std::end(gpt2_args));
  WriteFile(g_tmp + "/seed.flags", "# a comment\n--seed=7\n");
  WriteFile(g_tmp + "/seed.textproto", "seed: 7\n");
  const std::string flagfile = "--flagfile=" + g_tmp + "/seed.flags";

  // ---- train: model.
  add("train", "num_layers", V::kEffect, {"--num-layers", "1"}, tm);
  add("train", "hidden_size", V::kEffect, {"--hidden-size", "32"}, tm);
  add("train", "num_attention_heads", V::kEffect,
      {"--num-attention-heads", "4"}, tm);
  add("train", "group_query_attention", V::kEffect, {"--group-query-attention"},
      tm);
  add("train", "num_query_groups", V::kEffect, {"--num-query-groups", "2"},
      With(tm, {"--group-query-attention"}));
  add("train", "num_query_groups", V::kWarned, {"--num-query-groups", "2"}, tm);
  add("train", "ffn_hidden_size", V::kEffect, {"--ffn-hidden-size", "24"}, tm);
  add("train", "seq_length", V::kEffect, {"--seq-length", "8"}, tm);
  add("train", "max_position_embeddings", V::kEffect,
      {"--max-position-embeddings", "32"}, tm);
  add("train", "position_embedding_type", V::kEffect,
      {"--position-embedding-type", "rope"}, tm);
  add("train", "rotary_base", V::kEffect, {"--rotary-base", "50"}, rope);
  add("train", "rotary_base", V::kWarned, {"--rotary-base", "50"}, tm);
  // Llama 3 scaling: a context of 16 positions puts the tiny model's
  // frequencies (head_dim 8) in all three bands.
  const Context scaled = With(rope, {"--use-rope-scaling"});
  const Context scaled16 =
      With(scaled, {"--rope-scaling-original-max-position-embeddings", "16"});
  add("train", "use_rope_scaling", V::kEffect, {"--use-rope-scaling"},
      With(rope, {"--rope-scaling-original-max-position-embeddings", "16"}));
  add("train", "use_rope_scaling", V::kRefused, {"--use-rope-scaling"}, tm);
  add("train", "rope_scaling_factor", V::kEffect,
      {"--rope-scaling-factor", "2"}, scaled16);
  add("train", "rope_scaling_factor", V::kWarned,
      {"--rope-scaling-factor", "2"}, rope);
  add("train", "rope_scaling_low_freq_factor", V::kEffect,
      {"--rope-scaling-low-freq-factor", "0.1"}, scaled16);
  add("train", "rope_scaling_low_freq_factor", V::kWarned,
      {"--rope-scaling-low-freq-factor", "0.1"}, rope);
  add("train", "rope_scaling_high_freq_factor", V::kEffect,
      {"--rope-scaling-high-freq-factor", "2"}, scaled16);
  add("train", "rope_scaling_high_freq_factor", V::kWarned,
      {"--rope-scaling-high-freq-factor", "2"}, rope);
  add("train", "rope_scaling_original_max_position_embeddings", V::kEffect,
      {"--rope-scaling-original-max-position-embeddings", "16"}, scaled);
  add("train", "rope_scaling_original_max_position_embeddings", V::kWarned,
      {"--rope-scaling-original-max-position-embeddings", "16"}, rope);
  add("train", "normalization", V::kEffect, {"--normalization", "RMSNorm"}, tm);
  add("train", "norm_epsilon", V::kEffect, {"--norm-epsilon", "0.5"}, tm);
  add("train", "swiglu", V::kEffect, {"--swiglu"}, tm);
  add("train", "untie_embeddings_and_output_weights", V::kEffect,
      {"--untie-embeddings-and-output-weights"}, tm);
  add("train", "disable_bias_linear", V::kEffect, {"--disable-bias-linear"},
      tm);
  add("train", "add_qkv_bias", V::kEffect, {"--add-qkv-bias"},
      With(tm, {"--disable-bias-linear"}));
  add("train", "add_qkv_bias", V::kWarned, {"--add-qkv-bias"}, tm);
  add("train", "qk_layernorm", V::kEffect, {"--qk-layernorm"}, tm);
  // Mixture of experts (issue 41): the tiny model's two layers, 4 experts.
  const Context no_bias = With(tm, {"--disable-bias-linear"});
  const Context moe = With(no_bias, {"--num-experts", "4"});
  const Context moe_aux = With(moe, {"--moe-aux-loss-coeff", "0.1"});
  add("train", "num_experts", V::kEffect, {"--num-experts", "4"}, no_bias);
  add("train", "num_experts", V::kRefused, {"--num-experts", "4"}, tm);
  add("train", "moe_router_topk", V::kEffect, {"--moe-router-topk", "1"}, moe);
  add("train", "moe_pack_expert_weights", V::kEffect,
      {"--moe-pack-expert-weights"}, moe);
  add("train", "moe_router_topk", V::kWarned, {"--moe-router-topk", "1"}, tm);
  add("train", "moe_router_topk", V::kRefused, {"--moe-router-topk", "5"}, moe);
  add("train", "moe_ffn_hidden_size", V::kEffect,
      {"--moe-ffn-hidden-size", "8"}, moe);
  add("train", "moe_ffn_hidden_size", V::kWarned,
      {"--moe-ffn-hidden-size", "8"}, tm);
  add("train", "moe_layer_freq", V::kEffect, {"--moe-layer-freq", "2"}, moe);
  add("train", "moe_layer_freq", V::kWarned, {"--moe-layer-freq", "2"}, tm);
  add("train", "moe_layer_freq", V::kRefused, {"--moe-layer-freq", "[1,0,1]"},
      moe);
  add("train", "moe_shared_expert_intermediate_size", V::kEffect,
      {"--moe-shared-expert-intermediate-size", "8"}, moe);
  add("train", "moe_shared_expert_intermediate_size", V::kWarned,
      {"--moe-shared-expert-intermediate-size", "8"}, tm);
  add("train", "moe_shared_expert_gate", V::kEffect,
      {"--moe-shared-expert-gate"},
      With(moe, {"--moe-shared-expert-intermediate-size", "8"}));
  add("train", "moe_shared_expert_gate", V::kWarned,
      {"--moe-shared-expert-gate"}, moe);
  add("train", "moe_router_pre_softmax", V::kEffect,
      {"--moe-router-pre-softmax"}, moe);
  add("train", "moe_router_pre_softmax", V::kWarned,
      {"--moe-router-pre-softmax"},
      With(moe, {"--moe-router-score-function", "sigmoid"}));
  add("train", "moe_router_score_function", V::kEffect,
      {"--moe-router-score-function", "sigmoid"}, moe);
  add("train", "moe_router_score_function", V::kWarned,
      {"--moe-router-score-function", "sigmoid"}, tm);
  add("train", "moe_router_score_function", V::kRefused,
      {"--moe-router-score-function", "tanh"}, moe);
  add("train", "moe_router_load_balancing_type", V::kEffect,
      {"--moe-router-load-balancing-type", "none"}, moe_aux);
  add("train", "moe_router_load_balancing_type", V::kWarned,
      {"--moe-router-load-balancing-type", "none"}, tm);
  add("train", "moe_router_load_balancing_type", V::kRefused,
      {"--moe-router-load-balancing-type", "sinkhorn"}, moe);
  add("train", "moe_aux_loss_coeff", V::kEffect,
      {"--moe-aux-loss-coeff", "0.1"}, moe);
  add("train", "moe_aux_loss_coeff", V::kWarned,
      {"--moe-aux-loss-coeff", "0.1"}, tm);
  add("train", "moe_aux_loss_coeff", V::kWarned,
      {"--moe-aux-loss-coeff", "0.1"},
      With(moe, {"--moe-router-load-balancing-type", "none"}));
  add("train", "moe_z_loss_coeff", V::kEffect, {"--moe-z-loss-coeff", "0.1"},
      moe);
  add("train", "moe_z_loss_coeff", V::kWarned, {"--moe-z-loss-coeff", "0.1"},
      tm);
  add("train", "moe_router_enable_expert_bias", V::kEffect,
      {"--moe-router-enable-expert-bias"}, moe);
  add("train", "moe_router_enable_expert_bias", V::kWarned,
      {"--moe-router-enable-expert-bias"}, tm);
  add("train", "moe_router_bias_update_rate", V::kEffect,
      {"--moe-router-bias-update-rate", "0.5"},
      With(moe, {"--moe-router-enable-expert-bias"}));
  add("train", "moe_router_bias_update_rate", V::kWarned,
      {"--moe-router-bias-update-rate", "0.5"}, moe);
  add("train", "moe_grouped_gemm", V::kWarned, {"--moe-grouped-gemm"}, moe);
  add("train", "moe_router_dtype", V::kWarned, {"--moe-router-dtype", "fp32"},
      moe);
  add("train", "moe_router_dtype", V::kRefused, {"--moe-router-dtype", "fp64"},
      moe);
  add("train", "moe_token_dispatcher_type", V::kWarned,
      {"--moe-token-dispatcher-type", "alltoall"}, moe);
  add("train", "moe_token_dispatcher_type", V::kRefused,
      {"--moe-token-dispatcher-type", "flex"}, moe);
  add("train", "window_size", V::kEffect, {"--window-size", "2,0"}, tm);
  add("train", "window_size", V::kRefused, {"--window-size", "2,1"}, tm);
  // The planner's MoE model (planner/moe_model.h) predicts it.
  add("train", "dry_run", V::kEffect, {"--dry-run"}, moe);
  add("train", "hidden_dropout", V::kEffect, {"--hidden-dropout", "0.2"}, tm);
  add("train", "attention_dropout", V::kEffect, {"--attention-dropout", "0.2"},
      tm);
  add("train", "init_method_std", V::kEffect, {"--init-method-std", "0.1"}, tm);
  add("train", "vocab_size", V::kEffect, {"--vocab-size", "32"}, tm);
  add("train", "vocab_size", V::kWarned, {"--vocab-size", "32"}, td);
  add("train", "make_vocab_size_divisible_by", V::kEffect,
      {"--make-vocab-size-divisible-by", "7"}, tm);
  add("train", "recompute_granularity", V::kEffect,
      {"--recompute-granularity", "selective"}, deep);
  add("train", "recompute_method", V::kEffect, {"--recompute-method", "block"},
      full);
  add("train", "recompute_method", V::kWarned, {"--recompute-method", "block"},
      tm);
  add("train", "recompute_num_layers", V::kEffect,
      {"--recompute-num-layers", "2"}, full);
  add("train", "recompute_num_layers", V::kWarned,
      {"--recompute-num-layers", "2"}, tm);
  // Refused on the CPU device (it needs a GPU to offload from).
  add("train", "cpu_offloading", V::kRefused,
      {"--cpu-offloading", "--device", "cpu"}, tm);
  add("train", "cpu_offloading_num_layers", V::kWarned,
      {"--cpu-offloading-num-layers", "1"}, tm);
  // Refused on the CPU device (nothing to capture); its effect on the test
  // device is tools:cuda_graph_e2e_test's.
  add("train", "cuda_graph", V::kRefused, {"--cuda-graph", "--device", "cpu"},
      tm);
  add("train", "seed", V::kEffect, {"--seed", "7"}, tm);
  add("train", "bf16", V::kEffect, {"--bf16"}, tm);
  add("train", "fp16", V::kEffect, {"--fp16"}, tm);
  // ---- train: parallelism.
  add("train", "tensor_model_parallel_size", V::kEffect,
      {"--tensor-model-parallel-size", "2"}, dp2);
  add("train", "pipeline_model_parallel_size", V::kEffect,
      {"--pipeline-model-parallel-size", "2"}, dp2);
  add("train", "context_parallel_size", V::kEffect,
      {"--context-parallel-size", "2"}, dp2);
  add("train", "cp_comm_type", V::kEffect, {"--cp-comm-type", "a2a"},
      With(dp2, {"--context-parallel-size", "2"}));
  add("train", "cp_comm_type", V::kWarned, {"--cp-comm-type", "a2a"}, tm);
  // Mixture-of-experts parallelism: no MoE layers in the GPT model yet, so
  // what would need them is refused and the rest warns.
  add("train", "expert_model_parallel_size", V::kRefused,
      {"--expert-model-parallel-size", "2"}, tm);
  add("train", "expert_tensor_parallel_size", V::kRefused,
      {"--expert-tensor-parallel-size", "2"}, tm);
  add("train", "expert_tensor_parallel_size", V::kWarned,
      {"--expert-tensor-parallel-size", "1"}, tm);
  add("train", "moe_expert_capacity_factor", V::kRefused,
      {"--moe-expert-capacity-factor", "1.25"}, tm);
  add("train", "moe_token_drop_policy", V::kWarned,
      {"--moe-token-drop-policy", "position"}, tm);
  add("train", "moe_pack_expert_weights", V::kWarned,
      {"--moe-pack-expert-weights"}, tm);
  add("train", "moe_token_drop_policy", V::kRefused,
      {"--moe-token-drop-policy", "random"}, tm);
  add("train", "sequence_parallel", V::kEffect, {"--sequence-parallel"},
      With(dp2, {"--tensor-model-parallel-size", "2"}));
  add("train", "sequence_parallel", V::kWarned, {"--sequence-parallel"}, tm);
  // MoE layers under SP: each TP rank routes its own tokens (experts over
  // ETP = TP); EP beside TP runs with SP, and is refused without it.
  const Context moe_tp2 =
      Nproc(With(tm, {"--disable-bias-linear", "--num-experts", "4",
                      "--tensor-model-parallel-size", "2"}),
            2);
  add("train", "sequence_parallel", V::kEffect, {"--sequence-parallel"},
      moe_tp2);
  add("train", "expert_model_parallel_size", V::kEffect,
      {"--expert-model-parallel-size", "2"},
      With(moe_tp2,
           {"--sequence-parallel", "--expert-tensor-parallel-size", "1"}));
  add("train", "expert_model_parallel_size", V::kRefused,
      {"--expert-model-parallel-size", "2"}, moe_tp2);
  add("train", "num_layers_per_virtual_pipeline_stage", V::kEffect,
      {"--num-layers-per-virtual-pipeline-stage", "1"}, pp2);
  add("train", "num_layers_per_virtual_pipeline_stage", V::kRefused,
      {"--num-layers-per-virtual-pipeline-stage", "1"}, tm);
  add("train", "decoder_first_pipeline_num_layers", V::kEffect,
      {"--decoder-first-pipeline-num-layers", "1"}, pp2);
  add("train", "decoder_last_pipeline_num_layers", V::kEffect,
      {"--decoder-last-pipeline-num-layers", "1"}, pp2);
  add("train", "no_overlap_p2p_communication", V::kEffect,
      {"--no-overlap-p2p-communication"}, pp2);
  add("train", "no_overlap_p2p_communication", V::kWarned,
      {"--no-overlap-p2p-communication"}, tm);
  add("train", "pipeline_schedule", V::kEffect,
      {"--pipeline-schedule", "zb-h1"}, pp2);
  add("train", "pipeline_schedule", V::kWarned,
      {"--pipeline-schedule", "zb-h1"}, tm);
  // ZB-V needs two virtual stages per stage (refused without, naming it).
  add("train", "pipeline_schedule", V::kRefused, {"--pipeline-schedule", "zbv"},
      pp2);
  add("train", "pipeline_schedule", V::kEffect, {"--pipeline-schedule", "zbv"},
      With(pp2, {"--num-layers-per-virtual-pipeline-stage", "1"}));
  // ZB-H1 at PP 2 over 2 micro-batches, as a table; and one whose second
  // micro-batch has no backward on rank 1.
  const std::string zb_table =
      "rank,step,microbatch,chunk,op\n"
      "0,0,0,0,F\n0,1,1,0,F\n0,2,0,0,B\n0,3,0,0,W\n0,4,1,0,B\n0,5,1,0,W\n"
      "1,0,0,0,F\n1,1,0,0,B\n1,2,1,0,F\n1,3,1,0,B\n1,4,0,0,W\n1,5,1,0,W\n";
  WriteFile(g_tmp + "/zb_h1.csv", zb_table);
  WriteFile(g_tmp + "/missing_b.csv",
            zb_table.substr(0, zb_table.find("1,3,1,0,B")) +
                "1,3,0,0,W\n1,4,1,0,W\n");
  add("train", "pipeline_schedule_file", V::kEffect,
      {"--pipeline-schedule-file", g_tmp + "/zb_h1.csv"}, pp2);
  add("train", "pipeline_schedule_file", V::kWarned,
      {"--pipeline-schedule-file", g_tmp + "/zb_h1.csv"}, tm);
  add("train", "pipeline_schedule_file", V::kRefused,
      {"--pipeline-schedule-file", g_tmp + "/missing_b.csv"}, pp2);
  add("train", "use_distributed_optimizer", V::kEffect,
      {"--use-distributed-optimizer"}, dp2);
  // At DP 1 too: the optimizer shards over one rank.
  add("train", "use_distributed_optimizer", V::kEffect,
      {"--use-distributed-optimizer"}, tm);
  add("train", "data_parallel_sharding_strategy", V::kEffect,
      {"--data-parallel-sharding-strategy", "optim_grads_params"}, dp2);
  add("train", "data_parallel_sharding_strategy", V::kRefused,
      {"--data-parallel-sharding-strategy", "zero9"}, tm);
  add("train", "overlap_grad_reduce", V::kEffect, {"--overlap-grad-reduce"},
      dp2);
  add("train", "overlap_grad_reduce", V::kWarned, {"--overlap-grad-reduce"},
      With(dp2, {"--data-parallel-sharding-strategy", "optim_grads"}));
  add("train", "ddp_bucket_size", V::kEffect, {"--ddp-bucket-size", "100"},
      dp2);
  add("train", "ddp_bucket_size", V::kWarned, {"--ddp-bucket-size", "100"}, tm);
  add("train", "overlap_param_gather", V::kEffect, {"--overlap-param-gather"},
      With(dp2, {"--use-distributed-optimizer"}));
  add("train", "overlap_param_gather", V::kWarned, {"--overlap-param-gather"},
      dp2);
  add("train", "check_weight_hash_across_dp_replicas_interval", V::kEffect,
      {"--check-weight-hash-across-dp-replicas-interval", "1"}, dp2);
  add("train", "check_weight_hash_across_dp_replicas_interval", V::kWarned,
      {"--check-weight-hash-across-dp-replicas-interval", "1"}, tm);
  add("train", "check_grad_consistency_interval", V::kEffect,
      {"--check-grad-consistency-interval", "1"}, dp2);
  add("train", "check_grad_consistency_interval", V::kWarned,
      {"--check-grad-consistency-interval", "1"}, tm);
  add("train", "log_num_zeros_in_grad", V::kEffect, {"--log-num-zeros-in-grad"},
      tm);
  add("train", "log_params_norm", V::kEffect, {"--log-params-norm"}, tm);
  add("train", "debug_collectives", V::kEffect, {"--debug-collectives"}, dp2);
  add("train", "debug_collectives", V::kWarned, {"--debug-collectives"}, tm);
  add("train", "distributed_timeout_minutes", V::kEffect,
      {"--distributed-timeout-minutes", "2"}, dp2);
  add("train", "distributed_timeout_minutes", V::kWarned,
      {"--distributed-timeout-minutes", "2"}, tm);
  add("train", "exit_signal_handler", V::kEffect, {"--exit-signal-handler"},
      tm);
  add("train", "exit_duration_in_mins", V::kEffect,
      {"--exit-duration-in-mins", "0.00001"}, tm);
  add("train", "exit_interval", V::kEffect, {"--exit-interval", "1"}, tm);
  add("train", "log_straggler", V::kEffect, {"--log-straggler"}, tm);
  add("train", "rerun_mode", V::kEffect, {"--rerun-mode", "validate_results"},
      tm);
  add("train", "rerun_mode", V::kRefused, {"--rerun-mode", "report_stats"}, tm);
  const Context rerun = With(tm, {"--rerun-mode", "validate_results"});
  add("train", "check_for_spiky_loss", V::kEffect, {"--check-for-spiky-loss"},
      rerun);
  add("train", "check_for_spiky_loss", V::kWarned, {"--check-for-spiky-loss"},
      tm);
  add("train", "check_for_large_grads", V::kEffect, {"--check-for-large-grads"},
      rerun);
  add("train", "check_for_large_grads", V::kWarned, {"--check-for-large-grads"},
      tm);
  add("train", "spiky_loss_factor", V::kEffect, {"--spiky-loss-factor", "3"},
      With(rerun, {"--check-for-spiky-loss"}));
  add("train", "spiky_loss_factor", V::kWarned, {"--spiky-loss-factor", "3"},
      rerun);
  add("train", "error_injection_rate", V::kEffect,
      {"--error-injection-rate", "1"}, rerun);
  add("train", "error_injection_rate", V::kWarned,
      {"--error-injection-rate", "1"}, tm);
  add("train", "error_injection_type", V::kEffect,
      {"--error-injection-type", "persistent_error"},
      With(rerun, {"--error-injection-rate", "1"}));
  add("train", "error_injection_type", V::kWarned,
      {"--error-injection-type", "persistent_error"}, rerun);
  // Rank 1 sleeps 300 ms a step: always the slowest, and a straggler.
  const Context straggling = With(dp2, {"--log-straggler"});
  const std::vector<std::string> slow_rank1 = {"MCC_CHAOS_SLOW_RANK=1",
                                               "MCC_CHAOS_SLOW_MS=300"};
  add("train", "straggler_minmax_count", V::kEffect,
      {"--straggler-minmax-count", "2"}, straggling, slow_rank1);
  add("train", "straggler_minmax_count", V::kWarned,
      {"--straggler-minmax-count", "2"}, tm);
  add("train", "straggler_threshold", V::kEffect,
      {"--straggler-threshold", "1000"}, straggling, slow_rank1);
  add("train", "straggler_threshold", V::kWarned,
      {"--straggler-threshold", "2"}, tm);
  add("train", "accumulate_allreduce_grads_in_fp32", V::kRefused,
      {"--no-accumulate-allreduce-grads-in-fp32"}, tm);
  // ---- train: data.
  add("train", "data_path", V::kEffect, {"--data-path", g_tmp + "/corpus_b"},
      td);
  add("train", "data_path", V::kWarned, {"--data-path", g_tmp + "/corpus_b"},
      tm);
  add("train", "split", V::kEffect, {"--split", "1,1,0"}, td);
  add("train", "split", V::kWarned, {"--split", "1,1,0"}, tm);
  add("train", "mock_data", V::kEffect, {"--mock-data"}, td);
  add("train", "tokenizer_type", V::kEffect, gpt2, td);
  add("train", "tokenizer_type", V::kWarned, {"--tokenizer-type", "byte"}, tm);
  add("train", "vocab_file", V::kRefused,
      {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "/nonexistent",
       "--merge-file", g_gpt2_merges},
      td);
  add("train", "vocab_file", V::kWarned, {"--vocab-file", g_gpt2_vocab}, td);
  add("train", "merge_file", V::kRefused,
      {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", g_gpt2_vocab,
       "--merge-file", "/nonexistent"},
      td);
  add("train", "merge_file", V::kWarned, {"--merge-file", g_gpt2_merges}, td);
  add("train", "tokenizer_model", V::kRefused,
      {"--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
       "/nonexistent.json"},
      td);
  add("train", "tokenizer_model", V::kWarned,
      {"--tokenizer-model", "/nonexistent.json"}, td);
  add("train", "data_cache_path", V::kEffect,
      {"--data-cache-path", g_out + "/cache2"}, td);
  add("train", "data_cache_path", V::kWarned,
      {"--data-cache-path", g_out + "/cache"}, tm);
  add("train", "eod_mask_loss", V::kEffect, {"--eod-mask-loss"}, td);
  add("train", "eod_mask_loss", V::kWarned, {"--eod-mask-loss"}, tm);
  // Packed documents: the corpus's samples hold several documents.
  add("train", "reset_attention_mask", V::kEffect, {"--reset-attention-mask"},
      td);
  add("train", "reset_attention_mask", V::kWarned, {"--reset-attention-mask"},
      tm);
  add("train", "reset_position_ids", V::kEffect, {"--reset-position-ids"}, td);
  add("train", "reset_position_ids", V::kWarned, {"--reset-position-ids"}, tm);
  add("train", "reset_position_ids", V::kWarned, {"--reset-position-ids"},
      With(td, {"--position-embedding-type", "rope"}));
  add("train", "micro_batch_size", V::kEffect, {"--micro-batch-size", "1"}, tm);
  // ---- train: batch, schedule, optimizer.
  add("train", "global_batch_size", V::kEffect, {"--global-batch-size", "4"},
      tm);
  // Batch-size ramp-up: 2, then 4 from 4 samples on (after both steps).
  const Context gbs4 = With(tm, {"--global-batch-size", "4"});
  add("train", "rampup_batch_size", V::kEffect,
      {"--rampup-batch-size", "2,2,4"}, gbs4);
  add("train", "rampup_batch_size", V::kRefused,
      {"--rampup-batch-size", "3,2,4"}, gbs4);
  add("train", "train_iters", V::kEffect, {"--train-iters", "3"}, tm);
  add("train", "eval_iters", V::kEffect, {"--eval-iters", "2"}, tm);
  add("train", "eval_interval", V::kEffect, {"--eval-interval", "2"}, tm);
  add("train", "eval_interval", V::kWarned, {"--eval-interval", "2"},
      With(tm, {"--eval-iters", "0"}));
  add("train", "optimizer", V::kEffect, {"--optimizer", "sgd"}, tm);
  add("train", "lr", V::kEffect, {"--lr", "0.01"}, tm);
  add("train", "min_lr", V::kEffect, {"--min-lr", "0.0005"}, tm);
  add("train", "min_lr", V::kWarned, {"--min-lr", "0.0005"},
      With(tm, {"--lr-decay-style", "constant"}));
  add("train", "lr_warmup_iters", V::kEffect, {"--lr-warmup-iters", "1"}, tm);
  add("train", "lr_warmup_iters", V::kWarned, {"--lr-warmup-iters", "1"},
      With(tm, {"--lr-warmup-fraction", "0.5"}));
  add("train", "lr_warmup_fraction", V::kEffect,
      {"--lr-warmup-fraction", "0.5"}, tm);
  add("train", "lr_decay_iters", V::kEffect, {"--lr-decay-iters", "10"}, tm);
  add("train", "lr_decay_iters", V::kWarned, {"--lr-decay-iters", "10"},
      With(tm, {"--lr-decay-style", "constant"}));
  add("train", "lr_decay_style", V::kEffect, {"--lr-decay-style", "linear"},
      With(tm, {"--lr-decay-iters", "4"}));
  const Context wsd = With(tm, {"--lr-decay-style", "WSD", "--train-iters", "3",
                                "--lr-wsd-decay-iters", "2"});
  add("train", "lr_wsd_decay_iters", V::kEffect, {"--lr-wsd-decay-iters", "1"},
      wsd);
  add("train", "lr_wsd_decay_iters", V::kWarned, {"--lr-wsd-decay-iters", "1"},
      tm);
  add("train", "lr_wsd_decay_style", V::kEffect,
      {"--lr-wsd-decay-style", "linear"}, wsd);
  add("train", "lr_wsd_decay_style", V::kWarned,
      {"--lr-wsd-decay-style", "linear"}, tm);
  add("train", "weight_decay", V::kEffect, {"--weight-decay", "100"}, tm);
  add("train", "adam_beta1", V::kEffect, {"--adam-beta1", "0.5"}, tm);
  add("train", "adam_beta1", V::kWarned, {"--adam-beta1", "0.5"},
      With(tm, {"--optimizer", "sgd"}));
  add("train", "adam_beta2", V::kEffect, {"--adam-beta2", "0.5"}, tm);
  add("train", "adam_beta2", V::kWarned, {"--adam-beta2", "0.5"},
      With(tm, {"--optimizer", "sgd"}));
  add("train", "adam_eps", V::kEffect, {"--adam-eps", "0.1"}, tm);
  add("train", "adam_eps", V::kWarned, {"--adam-eps", "0.1"},
      With(tm, {"--optimizer", "sgd"}));
  add("train", "sgd_momentum", V::kEffect, {"--sgd-momentum", "0.1"},
      With(tm, {"--optimizer", "sgd"}));
  add("train", "sgd_momentum", V::kWarned, {"--sgd-momentum", "0.1"}, tm);
  // Adam's step does not depend on the gradient's scale: SGD's does.
  add("train", "clip_grad", V::kEffect, {"--clip-grad", "0.1"},
      With(tm, {"--optimizer", "sgd"}));
  // ---- train: fp16 loss scaling.
  add("train", "loss_scale", V::kEffect, {"--loss-scale", "1024"}, fp16);
  add("train", "loss_scale", V::kWarned, {"--loss-scale", "1024"}, tm);
  add("train", "initial_loss_scale", V::kEffect,
      {"--initial-loss-scale", "1024"}, fp16);
  add("train", "initial_loss_scale", V::kWarned,
      {"--initial-loss-scale", "1024"}, tm);
  // The first steps overflow at 2^32; at the minimum the scale stays.
  add("train", "min_loss_scale", V::kEffect, {"--min-loss-scale", "4294967296"},
      fp16);
  add("train", "min_loss_scale", V::kRefused, {"--min-loss-scale", "1e12"},
      fp16);
  add("train", "min_loss_scale", V::kWarned, {"--min-loss-scale", "2"}, tm);
  add("train", "loss_scale_window", V::kEffect, {"--loss-scale-window", "1"},
      With(fp16, {"--initial-loss-scale", "1024"}));
  add("train", "loss_scale_window", V::kWarned, {"--loss-scale-window", "1"},
      tm);
  add("train", "hysteresis", V::kEffect, {"--hysteresis", "1"}, fp16);
  add("train", "hysteresis", V::kWarned, {"--hysteresis", "1"},
      With(fp16, {"--loss-scale", "1024"}));
  // ---- train: FP8 (emulated on the CPU).
  const Context fp8 = With(tm, {"--fp8-format", "hybrid"});
  const Context fp8_max = With(fp8, {"--fp8-amax-compute-algo", "max"});
  add("train", "fp8_format", V::kEffect, {"--fp8-format", "hybrid"}, tm);
  add("train", "fp8_format", V::kRefused, {"--fp8-format", "e5m2"}, tm);
  add("train", "fp8_recipe", V::kEffect, {"--fp8-recipe", "tensorwise"}, fp8);
  add("train", "fp8_recipe", V::kRefused, {"--fp8-recipe", "mxfp8"}, fp8);
  add("train", "fp8_recipe", V::kWarned, {"--fp8-recipe", "tensorwise"}, tm);
  // A margin of 2^8 pushes small values into E4M3's subnormals.
  add("train", "fp8_margin", V::kEffect, {"--fp8-margin", "8"}, fp8);
  add("train", "fp8_margin", V::kWarned, {"--fp8-margin", "8"},
      With(fp8, {"--fp8-recipe", "tensorwise"}));
  add("train", "fp8_amax_history_len", V::kEffect,
      {"--fp8-amax-history-len", "4"}, fp8_max);
  add("train", "fp8_amax_history_len", V::kRefused,
      {"--fp8-amax-history-len", "0"}, fp8);
  add("train", "fp8_amax_history_len", V::kWarned,
      {"--fp8-amax-history-len", "4"}, tm);
  add("train", "fp8_amax_compute_algo", V::kEffect,
      {"--fp8-amax-compute-algo", "max"},
      With(fp8, {"--fp8-amax-history-len", "4"}));
  add("train", "fp8_amax_compute_algo", V::kWarned,
      {"--fp8-amax-compute-algo", "max"}, tm);
  // ---- train: checkpoints.
  add("train", "save", V::kEffect, {"--save", g_out + "/ckpt"}, tm);
  add("train", "save_interval", V::kEffect, {"--save-interval", "1"}, saving);
  add("train", "save_interval", V::kRefused, {"--save-interval", "1"}, tm);
  add("train", "async_save", V::kEffect, {"--async-save"}, saving);
  add("train", "async_save", V::kRefused, {"--async-save"}, tm);
  add("train", "keep_last", V::kEffect, {"--keep-last", "1"},
      With(saving, {"--save-interval", "1"}));
  add("train", "keep_last", V::kRefused, {"--keep-last", "1"}, tm);
  // A learning rate that overflows the weights after one step: the second
  // step's loss is NaN, which stops the run unless the check is off.
  add("train", "check_for_nan_in_loss_and_grad", V::kEffect,
      {"--check-for-nan-in-loss-and-grad=false"}, With(tm, {"--lr", "1e30"}));
  // A save that fails (its directory's parent is a file): the run stops
  // with the error, or, with the flag, logs it and finishes.
  WriteFile(g_tmp + "/not_a_dir", "");
  add("train", "continue_on_save_failure", V::kEffect,
      {"--continue-on-save-failure"},
      With(tm, {"--save", g_tmp + "/not_a_dir/ckpt", "--async-save"}));
  add("train", "continue_on_save_failure", V::kRefused,
      {"--continue-on-save-failure"}, tm);
  add("train", "load", V::kEffect, {"--load", g_tmp + "/ckpt_a"}, tm257);
  // ---- train: local (non-persistent) checkpoints.
  const std::string local_dir = g_out + "/local";
  const Context local_type = With(tm, {"--non-persistent-ckpt-type", "local"});
  const Context local_on =
      With(local_type, {"--non-persistent-local-ckpt-dir", local_dir,
                        "--non-persistent-save-interval", "2"});
  const Context local_dp2 = Nproc(With(local_on, {"--replication"}), 2);
  add("train", "non_persistent_ckpt_type", V::kEffect,
      {"--non-persistent-ckpt-type", "local"},
      With(tm, {"--non-persistent-local-ckpt-dir", local_dir,
                "--non-persistent-save-interval", "1"}));
  add("train", "non_persistent_ckpt_type", V::kRefused,
      {"--non-persistent-ckpt-type", "global"}, tm);
  add("train", "non_persistent_local_ckpt_dir", V::kEffect,
      {"--non-persistent-local-ckpt-dir", local_dir},
      With(local_type, {"--non-persistent-save-interval", "1"}));
  add("train", "non_persistent_local_ckpt_dir", V::kRefused,
      {"--non-persistent-local-ckpt-dir", local_dir}, tm);
  add("train", "non_persistent_save_interval", V::kEffect,
      {"--non-persistent-save-interval", "1"}, local_on);
  add("train", "non_persistent_save_interval", V::kRefused,
      {"--non-persistent-save-interval", "1"}, tm);
  add("train", "replication", V::kEffect, {"--replication"},
      Nproc(local_on, 2));
  add("train", "replication", V::kRefused, {"--replication"}, tm);
  add("train", "replication_jump", V::kEffect, {"--replication-jump", "3"},
      local_dp2);
  add("train", "replication_jump", V::kRefused, {"--replication-jump", "1"},
      local_on);
  add("train", "replication_factor", V::kRefused, {"--replication-factor", "3"},
      local_on);
  // ---- train: lower-precision optimizer state (issue 46).
  const Context distopt = With(saving, {"--use-distributed-optimizer"});
  const Context precision_aware =
      With(distopt, {"--use-precision-aware-optimizer"});
  add("train", "use_precision_aware_optimizer", V::kEffect,
      {"--use-precision-aware-optimizer"}, distopt);
  // As Megatron: only with the distributed optimizer.
  add("train", "use_precision_aware_optimizer", V::kRefused,
      {"--use-precision-aware-optimizer"}, tm);
  add("train", "exp_avg_dtype", V::kEffect, {"--exp-avg-dtype", "bf16"},
      precision_aware);
  add("train", "exp_avg_dtype", V::kRefused, {"--exp-avg-dtype", "bf16"},
      distopt);
  add("train", "exp_avg_sq_dtype", V::kEffect, {"--exp-avg-sq-dtype", "fp16"},
      precision_aware);
  add("train", "exp_avg_sq_dtype", V::kRefused, {"--exp-avg-sq-dtype", "bf16"},
      distopt);
  add("train", "main_params_dtype", V::kEffect, {"--main-params-dtype", "fp16"},
      With(precision_aware, {"--bf16"}));
  // fp32 weights are their own main copy.
  add("train", "main_params_dtype", V::kRefused,
      {"--main-params-dtype", "fp16"}, precision_aware);
  // ---- train: HSDP (issue 46).
  add("train", "num_distributed_optimizer_instances", V::kEffect,
      {"--num-distributed-optimizer-instances", "2"},
      Nproc(With(tm, {"--use-distributed-optimizer"}), 2));
  // Instances must divide DP (one process: DP 1).
  add("train", "num_distributed_optimizer_instances", V::kRefused,
      {"--num-distributed-optimizer-instances", "2"}, tm);
  // Without sharded state there is nothing to shard within an instance.
  add("train", "num_distributed_optimizer_instances", V::kRefused,
      {"--num-distributed-optimizer-instances", "2"}, dp2);
  // ---- train: optimizer offload (issue 46): refused on the CPU device
  // (the mock context runs --device auto, the CPU here).
  add("train", "optimizer_cpu_offload", V::kRefused,
      {"--optimizer-cpu-offload"}, tm);
  add("train", "optimizer_offload_fraction", V::kRefused,
      {"--optimizer-offload-fraction", "0.5"}, tm);
  add("train", "no_load_optim", V::kEffect, {"--no-load-optim"}, loading);
  add("train", "finetune", V::kEffect, {"--finetune"}, loading);
  add("train", "finetune", V::kRefused, {"--finetune"}, tm);
  add("train", "sft", V::kEffect, {"--sft"}, ctx.train_sft);
  add("train", "sft", V::kWarned, {"--sft"}, tm);
  add("train", "no_load_optim", V::kRefused, {"--no-load-optim"}, tm);
  add("train", "no_load_rng", V::kEffect, {"--no-load-rng"}, loading);
  add("train", "no_load_rng", V::kRefused, {"--no-load-rng"}, tm);
  // ---- train: logging and the rest.
  add("train", "log_interval", V::kEffect, {"--log-interval", "2"}, tm);
  add("train", "timing_log_level", V::kEffect, {"--timing-log-level", "1"}, tm);
  add("train", "metrics_file", V::kEffect,
      {"--metrics-file", g_out + "/m.jsonl"}, tm);
  add("train", "peak_tflops", V::kEffect, {"--peak-tflops", "2"}, tm);
  add("train", "tensorboard_dir", V::kEffect,
      {"--tensorboard-dir", g_out + "/tb"}, tm);
  const Context tb = With(tm, {"--tensorboard-dir", g_out + "/tb"});
  add("train", "tensorboard_log_interval", V::kEffect,
      {"--tensorboard-log-interval", "2"}, tb);
  add("train", "log_timers_to_tensorboard", V::kEffect,
      {"--log-timers-to-tensorboard"}, tb);
  add("train", "log_memory_to_tensorboard", V::kEffect,
      {"--log-memory-to-tensorboard"}, tb);
  for (const char* f : {"tensorboard_log_interval", "log_timers_to_tensorboard",
                        "log_memory_to_tensorboard"}) {
    add("train", f, V::kWarned,
        {"--" + Dashed(f) +
         (std::string(f) == "tensorboard_log_interval" ? "=2" : "")},
        tm);
  }
  // ---- train: the timeline (--profile).
  const std::vector<std::string> window = {
      "--profile",     "--profile-step-start", "0", "--profile-step-end", "2",
      "--profile-dir", g_out + "/prof"};
  add("train", "profile", V::kEffect, window, tm);
  const Context prof = With(tm, window);
  add("train", "profile_step_start", V::kEffect, {"--profile-step-start", "1"},
      prof);
  add("train", "profile_step_end", V::kEffect, {"--profile-step-end", "1"},
      prof);
  add("train", "profile_dir", V::kEffect, {"--profile-dir", g_out + "/p2"},
      prof);
  add("train", "profile_ranks", V::kEffect, {"--profile-ranks", "0", "1"},
      Nproc(prof, 2));
  add("train", "profile_step_start", V::kWarned, {"--profile-step-start", "0"},
      tm);
  add("train", "profile_step_end", V::kWarned, {"--profile-step-end", "1"}, tm);
  add("train", "profile_ranks", V::kWarned, {"--profile-ranks", "0"}, tm);
  add("train", "profile_dir", V::kWarned, {"--profile-dir", g_out + "/prof"},
      tm);
  add("train", "flight_recorder_dir", V::kEffect,
      {"--flight-recorder-dir", g_out + "/fr"}, tm);
  add("train", "preset", V::kEffect, {"--preset", "bench"}, tm);
  add("train", "dry_run", V::kEffect, {"--dry-run"}, tm);
  add("train", "config", V::kEffect, {"--config", g_tmp + "/seed.textproto"},
      tm);
  add("train", "num_threads", V::kEffect, {"--num-threads", "2"}, tm);
  // auto picks the CPU here too, but says why otherwise; cuda without a GPU
  // is refused (tools/device_e2e_test checks that).
  add("train", "device", V::kEffect, {"--device", "cpu"}, tm);
  add("train", "flagfile", V::kEffect, {flagfile}, tm);
  for (const char* f : {"fromenv", "tryfromenv", "undefok"}) {
    add("train", f, V::kRefused, {absl::StrCat("--", f, "=seed")}, tm);
  }

  // ---- eval.
  const Context& el = ctx.eval_loss;
  const Context& eg = ctx.eval_gen;
  const Context& ed = ctx.eval_data;
  add("eval", "load", V::kEffect, {"--load", g_tmp + "/ckpt_b"}, el);
  add("eval", "eval_iters", V::kEffect, {"--eval-iters", "2"}, el);
  add("eval", "prompt", V::kEffect, {"--prompt", "ab"}, el);
  add("eval", "prompt_ids", V::kEffect, {"--prompt-ids", "1 2"}, el);
  add("eval", "prompt_ids", V::kRefused, {"--prompt-ids", "1 2"}, eg);
  add("eval", "output_ids", V::kEffect, {"--output-ids"}, eg);
  add("eval", "output_ids", V::kWarned, {"--output-ids"}, el);
  add("eval", "max_new_tokens", V::kEffect, {"--max-new-tokens", "2"}, eg);
  add("eval", "max_new_tokens", V::kWarned, {"--max-new-tokens", "2"}, el);
  add("eval", "temperature", V::kEffect, {"--temperature", "0"}, eg);
  add("eval", "temperature", V::kWarned, {"--temperature", "0"}, el);
  add("eval", "top_k", V::kEffect, {"--top-k", "1"}, eg);
  add("eval", "top_k", V::kWarned, {"--top-k", "1"},
      With(eg, {"--temperature", "0"}));
  add("eval", "top_p", V::kEffect, {"--top-p", "0.01"}, eg);
  add("eval", "top_p", V::kWarned, {"--top-p", "0.01"}, el);
  add("eval", "no_kv_cache", V::kEffect, {"--no-kv-cache"}, eg);
  add("eval", "no_kv_cache", V::kWarned, {"--no-kv-cache"}, el);
  add("eval", "seed", V::kEffect, {"--seed", "2"}, eg);
  add("eval", "bf16", V::kEffect, {"--bf16"}, el);
  add("eval", "fp16", V::kEffect, {"--fp16"}, el);
  add("eval", "micro_batch_size", V::kEffect, {"--micro-batch-size", "1"}, el);
  add("eval", "micro_batch_size", V::kWarned, {"--micro-batch-size", "1"}, eg);
  add("eval", "make_vocab_size_divisible_by", V::kEffect,
      {"--make-vocab-size-divisible-by", "7"}, el);
  add("eval", "tensor_model_parallel_size", V::kEffect,
      {"--tensor-model-parallel-size", "2"}, Nproc(el, 2));
  add("eval", "pipeline_model_parallel_size", V::kEffect,
      {"--pipeline-model-parallel-size", "2"}, Nproc(el, 2));
  add("eval", "context_parallel_size", V::kRefused,
      {"--context-parallel-size", "2"}, Nproc(el, 2));
  add("eval", "cp_comm_type", V::kRefused, {"--cp-comm-type", "a2a"}, el);
  add("eval", "expert_model_parallel_size", V::kRefused,
      {"--expert-model-parallel-size", "2"}, el);
  add("eval", "expert_tensor_parallel_size", V::kRefused,
      {"--expert-tensor-parallel-size", "1"}, el);
  add("eval", "moe_expert_capacity_factor", V::kRefused,
      {"--moe-expert-capacity-factor", "1.25"}, el);
  add("eval", "moe_token_drop_policy", V::kRefused,
      {"--moe-token-drop-policy", "position"}, el);
  add("eval", "moe_pack_expert_weights", V::kRefused,
      {"--moe-pack-expert-weights"}, el);
  add("eval", "sequence_parallel", V::kWarned, {"--sequence-parallel"}, el);
  add("eval", "debug_collectives", V::kEffect, {"--debug-collectives"},
      Nproc(el, 2));
  add("eval", "debug_collectives", V::kWarned, {"--debug-collectives"}, el);
  add("eval", "distributed_timeout_minutes", V::kEffect,
      {"--distributed-timeout-minutes", "2"}, Nproc(el, 2));
  add("eval", "distributed_timeout_minutes", V::kWarned,
      {"--distributed-timeout-minutes", "2"}, el);
  add("eval", "num_threads", V::kEffect, {"--num-threads", "2"}, el);
  add("eval", "device", V::kEffect, {"--device", "cpu"}, el);
  add("eval", "data_path", V::kEffect, {"--data-path", g_tmp + "/corpus_b"},
      ed);
  add("eval", "data_path", V::kWarned, {"--data-path", g_tmp + "/corpus_b"},
      el);
  add("eval", "split", V::kEffect, {"--split", "1,1,0"}, ed);
  add("eval", "split", V::kWarned, {"--split", "1,1,0"}, el);
  add("eval", "mock_data", V::kEffect, {"--mock-data"}, ed);
  add("eval", "data_cache_path", V::kEffect,
      {"--data-cache-path", g_out + "/cache2"}, ed);
  add("eval", "data_cache_path", V::kWarned,
      {"--data-cache-path", g_out + "/cache"}, el);
  add("eval", "eod_mask_loss", V::kEffect, {"--eod-mask-loss"}, ed);
  add("eval", "eod_mask_loss", V::kWarned, {"--eod-mask-loss"}, el);
  add("eval", "reset_attention_mask", V::kEffect, {"--reset-attention-mask"},
      ed);
  add("eval", "reset_attention_mask", V::kWarned, {"--reset-attention-mask"},
      el);
  add("eval", "reset_position_ids", V::kEffect, {"--reset-position-ids"}, ed);
  add("eval", "reset_position_ids", V::kWarned, {"--reset-position-ids"}, el);
  add("eval", "tokenizer_type", V::kRefused, gpt2, ed);
  add("eval", "tokenizer_type", V::kWarned, {"--tokenizer-type", "byte"}, el);
  add("eval", "vocab_file", V::kWarned, {"--vocab-file", g_gpt2_vocab}, ed);
  add("eval", "merge_file", V::kWarned, {"--merge-file", g_gpt2_merges}, ed);
  add("eval", "tokenizer_model", V::kWarned,
      {"--tokenizer-model", "/nonexistent.json"}, ed);
  // Model flags: the checkpoint holds the model; a disagreeing one is
  // refused (agreeing ones pass).
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"num_layers", "3"},
           {"hidden_size", "32"},
           {"num_attention_heads", "4"},
           {"num_query_groups", "1"},
           {"group_query_attention", "true"},
           {"ffn_hidden_size", "24"},
           {"seq_length", "8"},
           {"max_position_embeddings", "64"},
           {"position_embedding_type", "rope"},
           {"rotary_base", "50"},
           {"use_rope_scaling", "true"},
           {"rope_scaling_factor", "4"},
           {"rope_scaling_low_freq_factor", "2"},
           {"rope_scaling_high_freq_factor", "8"},
           {"rope_scaling_original_max_position_embeddings", "16"},
           {"normalization", "RMSNorm"},
           {"norm_epsilon", "0.5"},
           {"swiglu", "true"},
           {"untie_embeddings_and_output_weights", "true"},
           {"disable_bias_linear", "true"},
           {"add_qkv_bias", "true"},
           {"qk_layernorm", "true"},
           {"window_size", "4,0"},
           {"vocab_size", "300"}}) {
    add("eval", flag, V::kRefused, {"--" + Dashed(flag) + "=" + value}, el);
  }
  // Training's flags that eval never reads.
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"hidden_dropout", "0.1"},
           {"attention_dropout", "0.1"},
           {"init_method_std", "0.1"},
           {"recompute_granularity", "full"},
           {"recompute_method", "block"},
           {"recompute_num_layers", "2"},
           {"cpu_offloading", "true"},
           {"cpu_offloading_num_layers", "1"},
           {"cuda_graph", "true"},
           {"num_layers_per_virtual_pipeline_stage", "1"},
           {"decoder_first_pipeline_num_layers", "1"},
           {"decoder_last_pipeline_num_layers", "1"},
           {"no_overlap_p2p_communication", "true"},
           {"save", "/tmp/x"},
           {"save_interval", "5"},
           {"async_save", "true"},
           {"keep_last", "2"},
           {"continue_on_save_failure", "true"},
           {"no_load_optim", "true"},
           {"no_load_rng", "true"}}) {
    add("eval", flag, V::kRefused, {"--" + Dashed(flag) + "=" + value}, el);
  }
  add("eval", "quantize", V::kEffect, {"--quantize", "int8"}, el);
  add("eval", "quantize", V::kEffect, {"--quantize", "fp8"}, el);
  add("eval", "quantize", V::kEffect, {"--quantize", "fp8-per-tensor"}, el);
  add("eval", "flagfile", V::kEffect, {flagfile}, eg);
  for (const char* f : {"fromenv", "tryfromenv", "undefok"}) {
    add("eval", f, V::kRefused, {absl::StrCat("--", f, "=seed")}, el);
  }

  // ---- convert_checkpoint.
  const Context& ex = ctx.export_hf;
  const Context& im = ctx.import_hf;
  add("convert_checkpoint", "load", V::kEffect, {"--load", g_tmp + "/ckpt_b"},
      ex);
  add("convert_checkpoint", "load", V::kRefused, {"--load", g_tmp + "/ckpt_b"},
      im);
  add("convert_checkpoint", "export_hf", V::kEffect,
      {"--export-hf", g_out + "/hf2"}, ex);
  add("convert_checkpoint", "import_hf", V::kEffect,
      {"--import-hf", g_tmp + "/hf_b"}, im);
  add("convert_checkpoint", "save", V::kEffect, {"--save", g_out + "/ckpt2"},
      im);
  add("convert_checkpoint", "save", V::kRefused, {"--save", g_out + "/ckpt2"},
      ex);
  add("convert_checkpoint", "max_shard_size", V::kEffect,
      {"--max-shard-size", "1KB"}, ex);
  add("convert_checkpoint", "max_shard_size", V::kRefused,
      {"--max-shard-size", "1KB"}, im);
  Context rewrite;
  rewrite.args = {"--load", g_tmp + "/ckpt_a", "--save", g_out + "/ckpt_q"};
  add("convert_checkpoint", "quantize", V::kEffect, {"--quantize", "int8"},
      rewrite);
  add("convert_checkpoint", "quantize", V::kRefused, {"--quantize", "int8"},
      ex);
  add("convert_checkpoint", "quantize", V::kRefused, {"--quantize", "int4"},
      rewrite);
  add("convert_checkpoint", "flagfile", V::kEffect,
      {"--flagfile=" + g_tmp + "/export.flags"}, ex);
  for (const char* f : {"fromenv", "tryfromenv", "undefok"}) {
    add("convert_checkpoint", f, V::kRefused, {absl::StrCat("--", f, "=load")},
        ex);
  }

  // ---- preprocess_data (Abseil's parser: its own flags work).
  const Context& pr = ctx.preprocess;
  add("preprocess_data", "input", V::kEffect,
      {"--input", g_tmp + "/corpus_b.jsonl"}, pr);
  add("preprocess_data", "json_keys", V::kEffect, {"--json-keys", "title"}, pr);
  add("preprocess_data", "output_prefix", V::kEffect,
      {"--output-prefix", g_out + "/q"}, pr);
  add("preprocess_data", "tokenizer_type", V::kEffect, gpt2, pr);
  add("preprocess_data", "vocab_file", V::kRefused,
      {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "/nonexistent",
       "--merge-file", g_gpt2_merges},
      pr);
  add("preprocess_data", "vocab_file", V::kWarned,
      {"--vocab-file", g_gpt2_vocab}, pr);
  add("preprocess_data", "merge_file", V::kRefused,
      {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", g_gpt2_vocab,
       "--merge-file", "/nonexistent"},
      pr);
  add("preprocess_data", "merge_file", V::kWarned,
      {"--merge-file", g_gpt2_merges}, pr);
  add("preprocess_data", "tokenizer_model", V::kRefused,
      {"--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model",
       "/nonexistent.model"},
      pr);
  add("preprocess_data", "tokenizer_model", V::kWarned,
      {"--tokenizer-model", "/nonexistent.model"}, pr);
  add("preprocess_data", "append_eod", V::kEffect, {"--append-eod"}, pr);
  const Context& pr_sft = ctx.preprocess_sft;
  add("preprocess_data", "sft", V::kEffect, {"--sft"}, pr_sft);
  add("preprocess_data", "tokenizer_config", V::kEffect,
      {"--tokenizer-config", g_tmp + "/chat_b"}, With(pr_sft, {"--sft"}));
  add("preprocess_data", "tokenizer_config", V::kWarned,
      {"--tokenizer-config", g_tmp + "/chat_b"}, pr);
  add("preprocess_data", "workers", V::kEffect, {"--workers", "2"}, pr);
  add("preprocess_data", "skip_bad_records", V::kEffect, {"--skip-bad-records"},
      With(pr, {"--input", g_tmp + "/corpus_bad.jsonl"}));
  add("preprocess_data", "log_interval", V::kEffect, {"--log-interval", "1"},
      pr);
  add("preprocess_data", "num_threads", V::kRefused, {"--num-threads", "2"},
      pr);
  add("preprocess_data", "flagfile", V::kEffect,
      {"--flagfile=" + g_tmp + "/eod.flags"}, pr);
  add("preprocess_data", "fromenv", V::kEffect, {"--fromenv=append_eod"}, pr,
      {"FLAGS_append_eod=true"});
  add("preprocess_data", "tryfromenv", V::kEffect, {"--tryfromenv=append_eod"},
      pr, {"FLAGS_append_eod=true"});
  add("preprocess_data", "undefok", V::kEffect, {"--undefok=bogus"},
      With(pr, {"--bogus=1"}));

  // ---- launch (Abseil's parser).
  const Context& la = ctx.launch;
  add("launch", "nproc_per_node", V::kEffect, {"--nproc_per_node", "2"}, la);
  add("launch", "nnodes", V::kEffect, {"--nnodes", "2"}, la);
  add("launch", "node_rank", V::kEffect, {"--node_rank", "1"},
      With(la, {"--nnodes", "2"}));
  add("launch", "master_addr", V::kEffect, {"--master_addr", "10.1.2.3"}, la);
  add("launch", "master_port", V::kEffect, {"--master_port", "29413"}, la);
  // Node 1 of two has no job id of its own: the flag gives its ranks one.
  add("launch", "rdzv_id", V::kEffect, {"--rdzv-id", "run7"}, ctx.launch_node1);
  // Node 1 of two has no secret of its own: its ranks get the file's.
  add("launch", "rdzv_secret_file", V::kEffect,
      {"--rdzv-secret-file", g_tmp + "/job.secret"}, ctx.launch_node1);
  // Rank 1 outlives rank 0 by 3 s: the flag stops it as a failed rank.
  add("launch", "rank_exit_timeout_s", V::kEffect,
      {"--rank-exit-timeout-s", "0.5"}, ctx.launch_linger);
  t.back().code = 1;
  add("launch", "grace_period_s", V::kEffect, {"--grace-period-s", "0.2"},
      ctx.launch_grace);
  t.back().code = 3;  // Rank 1's.
  // Rank 1 fails again after the restart: the restart shows, the code stays.
  add("launch", "max_restarts", V::kEffect, {"--max-restarts", "1"},
      ctx.launch_grace);
  t.back().code = 3;
  add("launch", "flagfile", V::kEffect, {"--flagfile=" + g_tmp + "/addr.flags"},
      la);
  add("launch", "fromenv", V::kEffect, {"--fromenv=master_addr"}, la,
      {"FLAGS_master_addr=10.9.9.9"});
  add("launch", "tryfromenv", V::kEffect, {"--tryfromenv=master_addr"}, la,
      {"FLAGS_master_addr=10.9.9.9"});
  add("launch", "undefok", V::kEffect, {"--undefok=bogus"},
      With(la, {"--bogus=1"}));
  return t;
}

const char* const kBinaries[] = {"train", "eval", "convert_checkpoint",
                                 "preprocess_data", "launch"};

class FlagsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    g_tmp = std::string(tmp != nullptr ? tmp : "/tmp") + "/flags_test";
    RemoveTree(g_tmp);
    mkdir(g_tmp.c_str(), 0755);
    g_out = g_tmp + "/out";
    // Two small corpora, one with a bad record.
    std::string a, b;
    for (int i = 0; i < 300; ++i) {
      absl::StrAppend(&a, "{\"text\": \"document ", i, " says hello to ", i * 7,
                      " friends\", \"title\": \"t", i, "\"}\n");
      absl::StrAppend(&b, "{\"text\": \"other text number ", i * 3,
                      " is here\", \"title\": \"u", i, "\"}\n");
    }
    WriteFile(g_tmp + "/corpus_a.jsonl", a);
    WriteFile(g_tmp + "/corpus_b.jsonl", b);
    WriteFile(g_tmp + "/corpus_bad.jsonl", a + "{not json\n");
    // Conversations (with a "text" too, so a run without --sft reads them)
    // and two chat templates.
    std::string conversations;
    for (int i = 0; i < 300; ++i) {
      absl::StrAppend(
          &conversations, "{\"text\": \"plain ", i,
          "\", \"messages\": [{\"role\": \"user\", \"content\": \"what is ", i,
          " plus one?\"}, {\"role\": \"assistant\", \"content\": \"it is ",
          i + 1, "\"}]}\n");
    }
    WriteFile(g_tmp + "/conversations.jsonl", conversations);
    mkdir((g_tmp + "/chat_a").c_str(), 0755);
    mkdir((g_tmp + "/chat_b").c_str(), 0755);
    WriteFile(g_tmp + "/chat_a/tokenizer_config.json",
              "{\"chat_template\": \"{% for m in messages %}<|im_start|>"
              "{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\\n"
              "{% endif %}\", \"eos_token\": \"<|im_end|>\"}");
    WriteFile(g_tmp + "/chat_b/tokenizer_config.json",
              "{\"chat_template\": \"{% for m in messages %}[{{ m.role }}] "
              "{{ m.content }}\\n{% endfor %}{% if add_generation_prompt %}"
              "[assistant] {% endif %}\"}");
    {
      Outcome r = Execute(
          {g_bin["preprocess_data"], "--input", g_tmp + "/conversations.jsonl",
           "--output-prefix", g_tmp + "/sft", "--tokenizer-type",
           "ByteTokenizer", "--sft", "--tokenizer-config",
           g_tmp + "/chat_a/tokenizer_config.json", "--append-eod"});
      ASSERT_EQ(r.code, 0) << Show(r);
    }
    WriteFile(g_tmp + "/eod.flags", "--append_eod\n");
    WriteFile(g_tmp + "/addr.flags", "--master_addr=10.7.7.7\n");
    WriteFile(g_tmp + "/job.secret", "flags test secret\n");
    for (const char* name : {"a", "b"}) {
      Outcome r =
          Execute({g_bin["preprocess_data"], "--input",
                   absl::StrCat(g_tmp, "/corpus_", name, ".jsonl"),
                   "--output-prefix", absl::StrCat(g_tmp, "/corpus_", name),
                   "--tokenizer-type", "ByteTokenizer", "--append-eod"});
      ASSERT_EQ(r.code, 0) << Show(r);
      for (const char* ext : {".bin", ".idx"}) {
        ASSERT_EQ(
            std::rename(
                absl::StrCat(g_tmp, "/corpus_", name, "_text_document", ext)
                    .c_str(),
                absl::StrCat(g_tmp, "/corpus_", name, ext).c_str()),
            0);
      }
    }
    const std::vector<std::string> model = {
        "--num-layers",          "2", "--hidden-size", "16",
        "--num-attention-heads", "2", "--seq-length",  "16",
        "--micro-batch-size",    "2", "--peak-tflops", "1",
        "--num-threads",         "1", "--train-iters", "2",
        "--log-interval",        "1", "--eval-iters",  "1",
        "--eval-interval",       "1"};
    ctx.train_mock.args = model;
    ctx.train_mock.args.insert(ctx.train_mock.args.end(),
                               {"--mock-data", "--vocab-size", "64"});
    ctx.train_data.args = model;
    // Index caches under out/, so every run builds them afresh.
    ctx.train_data.args.insert(ctx.train_data.args.end(),
                               {"--data-path", g_tmp + "/corpus_a",
                                "--data-cache-path", g_out + "/cache"});
    // Checkpoints (vocabulary 257: the byte tokenizer's), and their exports.
    for (const auto& [name, seed] :
         std::vector<std::pair<std::string, std::string>>{{"a", "1"},
                                                          {"b", "2"}}) {
      Outcome r = RunIn(
          "train", ctx.train_mock,
          {"--vocab-size", "257", "--seed", seed, "--hidden-dropout", "0.1",
           "--train-iters", "1", "--save", g_tmp + "/ckpt_" + name});
      ASSERT_EQ(r.code, 0) << Show(r);
      r = Execute({g_bin["convert_checkpoint"], "--load",
                   g_tmp + "/ckpt_" + name, "--export-hf",
                   g_tmp + "/hf_" + name});
      ASSERT_EQ(r.code, 0) << Show(r);
    }
    WriteFile(g_tmp + "/export.flags",
              absl::StrCat("--load=", g_tmp, "/ckpt_b\n"));
    ctx.eval_loss.args = {
        "--load", g_tmp + "/ckpt_a",    "--mock-data", "--eval-iters",
        "1",      "--micro-batch-size", "2",           "--num-threads",
        "1"};
    ctx.eval_gen.args = {
        "--load", g_tmp + "/ckpt_a", "--prompt", "hello", "--max-new-tokens",
        "6",      "--num-threads",   "1"};
    ctx.eval_data.args = {"--load",
                          g_tmp + "/ckpt_a",
                          "--data-path",
                          g_tmp + "/corpus_a",
                          "--data-cache-path",
                          g_out + "/cache",
                          "--eval-iters",
                          "1",
                          "--micro-batch-size",
                          "2",
                          "--num-threads",
                          "1"};
    ctx.export_hf.args = {"--load", g_tmp + "/ckpt_a", "--export-hf",
                          g_out + "/hf"};
    ctx.import_hf.args = {"--import-hf", g_tmp + "/hf_a", "--save",
                          g_out + "/ckpt"};
    ctx.preprocess.args = {"--input",          g_tmp + "/corpus_a.jsonl",
                           "--output-prefix",  g_out + "/p",
                           "--tokenizer-type", "ByteTokenizer"};
    ctx.preprocess_sft.args = {"--input",
                               g_tmp + "/conversations.jsonl",
                               "--output-prefix",
                               g_out + "/p",
                               "--tokenizer-type",
                               "ByteTokenizer",
                               "--tokenizer-config",
                               g_tmp + "/chat_a"};
    ctx.train_sft.args = model;
    ctx.train_sft.args.insert(ctx.train_sft.args.end(),
                              {"--data-path", g_tmp + "/sft_messages_document",
                               "--data-cache-path", g_out + "/cache"});
    ctx.launch.args = {"--master_port", "29411"};
    ctx.launch.tail = {
        "--", "/bin/sh", "-c",
        "echo rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE "
        "local_world=$LOCAL_WORLD_SIZE node=$NODE_RANK addr=$MASTER_ADDR "
        "port=$MASTER_PORT"};
    // Rank 1 fails (after rank 0 has had a second to ignore SIGTERM); rank 0
    // then runs until the launcher's SIGKILL.
    ctx.launch_node1.args = {"--master_port", "29411", "--nnodes", "2",
                             "--node_rank",   "1"};
    ctx.launch_node1.tail = {
        "--", "/bin/sh", "-c",
        "echo job=$MCC_JOB_ID secret_file=$MCC_JOB_SECRET_FILE"};
    ctx.launch_linger.args = {"--nproc_per_node", "2", "--grace_period_s",
                              "0.5"};
    ctx.launch_linger.tail = {"--", "/bin/sh", "-c",
                              "if [ $RANK = 1 ]; then sleep 3; fi"};
    ctx.launch_grace.args = {"--nproc_per_node", "2", "--grace_period_s",
                             "0.5"};
    ctx.launch_grace.tail = {
        "--", "/bin/sh", "-c",
        "if [ $RANK = 1 ]; then sleep 1; exit 3; fi; trap '' TERM; "
        "sleep 5"};
  }
};

TEST_F(FlagsTest, EveryFlagIsClassified) {
  const std::vector<Row> table = Table();
  for (const char* binary : kBinaries) {
    std::set<std::string> registered = RegisteredFlags(binary);
    ASSERT_FALSE(registered.empty()) << binary << " --helpfull listed no flags";
    std::set<std::string> classified;
    for (const Row& row : table) {
      if (row.binary == binary) classified.insert(row.flag);
    }
    std::vector<std::string> unclassified, stale;
    std::set_difference(registered.begin(), registered.end(),
                        classified.begin(), classified.end(),
                        std::back_inserter(unclassified));
    std::set_difference(classified.begin(), classified.end(),
                        registered.begin(), registered.end(),
                        std::back_inserter(stale));
    EXPECT_TRUE(unclassified.empty())
        << binary << " accepts flags that no row of tools/flags_test.cc "
        << "classifies (give each an effect, a refusal or a warning, and a "
        << "row): --" << absl::StrJoin(unclassified, ", --");
    EXPECT_TRUE(stale.empty())
        << binary << " has no flags --" << absl::StrJoin(stale, ", --")
        << " that tools/flags_test.cc classifies";
  }
}

// --config FILE's fields are train's flags; every flag has a field except
// those that only make sense on a command line.
TEST_F(FlagsTest, TrainConfigMirrorsTrainFlags) {
  const std::set<std::string> registered = RegisteredFlags("train");
  std::set<std::string> fields;
  const google::protobuf::Descriptor* d =
      mcc::training::TrainConfig::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    fields.insert(d->field(i)->name());
    EXPECT_TRUE(registered.count(d->field(i)->name()))
        << "TrainConfig." << d->field(i)->name() << " matches no train flag";
  }
  std::set<std::string> without_field;
  for (const std::string& flag : registered) {
    if (!fields.count(flag)) without_field.insert(flag);
  }
  EXPECT_EQ(without_field,
            (std::set<std::string>{"config", "flagfile", "fromenv",
                                   "tryfromenv", "undefok"}));
}

// A program that builds a TrainConfig in code gets what train does without
// the flag: each field's proto default is its flag's default.
TEST_F(FlagsTest, TrainConfigDefaultsAreTheFlagDefaults) {
  Outcome r = Execute({g_bin["train"], "--helpfull"});
  std::map<std::string, std::string> defaults;
  static const std::regex line(R"(^\s+--([A-Za-z0-9_-]+) \(default (.*?)\): )");
  for (absl::string_view l : absl::StrSplit(r.out + r.err, '\n')) {
    std::smatch m;
    std::string text(l);
    if (std::regex_search(text, m, line)) {
      defaults[absl::StrReplaceAll(m[1].str(), {{"-", "_"}})] = m[2].str();
    }
  }
  ASSERT_FALSE(defaults.empty()) << "train --helpfull listed no defaults";
  const mcc::training::TrainConfig config;
  const google::protobuf::Descriptor* d = config.GetDescriptor();
  const google::protobuf::Reflection* reflection = config.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    ASSERT_TRUE(defaults.count(f->name())) << f->name();
    const std::string& flag = defaults[f->name()];
    using google::protobuf::FieldDescriptor;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        double want = 0;
        ASSERT_TRUE(absl::SimpleAtod(flag, &want)) << f->name() << ": " << flag;
        const double got =
            f->cpp_type() == FieldDescriptor::CPPTYPE_INT32
                ? reflection->GetInt32(config, f)
            : f->cpp_type() == FieldDescriptor::CPPTYPE_INT64
                ? static_cast<double>(reflection->GetInt64(config, f))
                : reflection->GetDouble(config, f);
        EXPECT_EQ(got, want) << "TrainConfig." << f->name() << " defaults to "
                             << got << ", its flag to " << flag;
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL:
        EXPECT_EQ(reflection->GetBool(config, f) ? "true" : "false", flag)
            << "TrainConfig." << f->name();
        break;
      default:
        EXPECT_EQ(reflection->GetString(config, f), flag)
            << "TrainConfig." << f->name();
    }
  }
}

// Not in the registry, so not in the table: --help and --helpfull print the
// usage; glog's own flags (--v, --logtostderr, ...) are gflags that no binary
// parses, so they are refused as unknown.
TEST_F(FlagsTest, HelpWorksAndGlogFlagsAreRefused) {
  for (const char* binary : kBinaries) {
    for (const char* help : {"--help", "--helpfull"}) {
      Outcome r = Execute({g_bin[binary], help});
      EXPECT_THAT(r.out + r.err, ::testing::HasSubstr("--")) << Show(r);
    }
    for (const char* glog : {"--v=1", "--logtostderr", "--minloglevel=1"}) {
      Outcome r = Execute({g_bin[binary], glog});
      EXPECT_NE(r.code, 0) << Show(r);
      const std::string name(absl::StripPrefix(
          std::string(glog).substr(0, std::string(glog).find('=')), "--"));
      EXPECT_THAT(r.err, ::testing::HasSubstr(name)) << Show(r);
    }
  }
}

TEST_F(FlagsTest, EveryRowHoldsItsVerdict) {
  std::map<std::string, std::vector<std::string>> baselines;
  int checked = 0;
  // MCC_FLAGS_TEST_ROWS=REGEX checks only the rows of matching flags
  // (underscored), for working on a few.
  const char* only = std::getenv("MCC_FLAGS_TEST_ROWS");
  for (const Row& row : Table()) {
    if (only != nullptr && !std::regex_match(row.flag, std::regex(only))) {
      continue;
    }
    SCOPED_TRACE(absl::StrCat(row.binary, " --", Dashed(row.flag)));
    const std::string key =
        absl::StrCat(row.binary, "|", absl::StrJoin(row.context.args, " "), "|",
                     absl::StrJoin(row.context.tail, " "), "|",
                     row.context.nproc, "|", absl::StrJoin(row.env, " "));
    if (!baselines.count(key)) {
      // Twice: an effect is only an effect if the run repeats itself.
      Outcome base = RunIn(row.binary, row.context, {}, row.env);
      baselines[key] = Observe(base, row.context.nproc > 1);
      Outcome again = RunIn(row.binary, row.context, {}, row.env);
      const std::vector<std::string> repeat =
          Observe(again, row.context.nproc > 1);
      EXPECT_TRUE(repeat == baselines[key])
          << "the context's run does not repeat itself:\n"
          << Diff(repeat, baselines[key]) << "\n"
          << Show(again);
    }
    const std::vector<std::string>& base = baselines[key];
    Outcome r = RunIn(row.binary, row.context, row.args, row.env);
    const std::vector<std::string> seen = Observe(r, row.context.nproc > 1);
    const std::string name = "--" + Dashed(row.flag);
    const std::string underscored = "--" + row.flag;
    ++checked;
    switch (row.verdict) {
      case Verdict::kEffect:
        EXPECT_EQ(r.code, row.code) << Show(r);
        EXPECT_TRUE(seen != base) << "no observable effect:\n" << Show(r);
        EXPECT_FALSE(absl::StrContains(r.err, name + " has no effect"))
            << Show(r);
        break;
      case Verdict::kRefused: {
        EXPECT_EQ(r.code, 2) << Show(r);
        std::string err(absl::StripTrailingAsciiWhitespace(r.err));
        // Under the launcher: the rank's line and the launcher's own.
        if (row.context.nproc > 1) {
          EXPECT_TRUE(absl::StrContains(err, name) ||
                      absl::StrContains(err, underscored))
              << Show(r);
        } else {
          EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 0)
              << "not one line:\n"
              << Show(r);
          EXPECT_TRUE(absl::StrContains(err, name) ||
                      absl::StrContains(err, underscored))
              << "the refusal does not name the flag:\n"
              << Show(r);
        }
        break;
      }
      case Verdict::kWarned: {
        EXPECT_EQ(r.code, 0) << Show(r);
        EXPECT_TRUE(absl::StrContains(r.err, name + " has no effect"))
            << Show(r);
        // Nothing else changed.
        std::vector<std::string> rest;
        for (const std::string& line : seen) {
          if (!absl::StrContains(line, " has no effect in this run: ")) {
            rest.push_back(line);
          }
        }
        std::vector<std::string> base_rest;
        for (const std::string& line : base) {
          if (!absl::StrContains(line, " has no effect in this run: ")) {
            base_rest.push_back(line);
          }
        }
        EXPECT_TRUE(rest == base_rest) << "warned, but it changed the run:\n"
                                       << Diff(rest, base_rest) << "\n"
                                       << Show(r);
        break;
      }
    }
  }
  if (only == nullptr) EXPECT_GT(checked, 100);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Arguments: the binaries' paths, in kBinaries order, then the GPT-2 files.
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: flags_test TRAIN EVAL CONVERT PREPROCESS LAUNCH "
                 "ENCODER_JSON VOCAB_BPE\n");
    return 2;
  }
  char cwd[4096];
  const std::string here = getcwd(cwd, sizeof(cwd)) ? cwd : ".";
  auto absolute = [&](const std::string& p) {
    return p[0] == '/' ? p : here + "/" + p;
  };
  for (int i = 0; i < 5; ++i) g_bin[kBinaries[i]] = absolute(argv[i + 1]);
  g_gpt2_vocab = absolute(argv[6]);
  g_gpt2_merges = absolute(argv[7]);
  // train and eval otherwise run themselves again with it set.
  setenv("OMP_WAIT_POLICY", "passive", 1);
  return RUN_ALL_TESTS();
}
